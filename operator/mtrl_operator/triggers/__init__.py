"""MultiTurnRLTrigger: runs started by S3 uploads (see docs/triggers.md).

`notifications` parses what arrives in the queue, `decide` chooses what to do with it, `build`
makes the run and the AWS request bodies; all three are pure. `controller` runs them against
the API server and AWS.
"""
