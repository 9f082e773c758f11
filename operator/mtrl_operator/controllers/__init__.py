"""Controllers: caches of watched objects, work queues, and the reconciles that observe through
the adapters, decide with `reconcile`, and act through the adapters again."""
