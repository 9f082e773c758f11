"""A real local control plane and AWS endpoint for tests and the demo."""
