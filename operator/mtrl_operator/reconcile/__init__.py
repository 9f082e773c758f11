"""Pure decisions: observed state in, status and actions out. Nothing here talks to a server."""
