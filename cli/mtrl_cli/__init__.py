"""Commands for people, next to kubectl: `mtrl runs`, `mtrl watch`, `mtrl curve`, `mtrl logs`.

Each command module has a `main(argv)` that `mtrl` (and the kubectl plug-in `kubectl mtrl`)
calls lazily. They read through the kubeconfig kubectl would use and the AWS credentials boto3
finds; a failure is one line on stderr naming what failed and where (exit 1), never a
traceback.
"""
