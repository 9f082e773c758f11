"""Thin clients for the outside world: Kubernetes (lightkube) and AWS (boto3 in threads)."""
