"""fa4cache on torch.distributed: the job's c10d store as a remote tier
(:mod:`.tier`), and a cold job's kernel set compiled across its nodes (:mod:`.split`)."""
