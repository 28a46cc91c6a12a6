"""The decode path: KV-cache steps and continuous batching on FA4's kernels, for
transformers' ``generate`` and ``generate_batch``.

:func:`.choose.choose` decides how each step runs (:class:`.choose.Choice`); :mod:`.kv_cache`
runs it over the step's key ranges (:mod:`.key_ranges`, shared by a step's layers:
:mod:`.step_ranges`), with launch plans (:mod:`.launch_plans`, :mod:`.plan`,
:mod:`.observe`, :mod:`.launch`) and lanes (:mod:`.lanes`), split-KV (:mod:`.split_kv`) or
SDPA (:mod:`.one_row_sdpa`); :mod:`.paged` runs continuous batching's steps and :mod:`.op`
registers the custom ops torch.compile sees.
"""
