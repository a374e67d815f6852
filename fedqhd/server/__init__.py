"""Server side: the Flower ServerApp (:mod:`fedqhd.server.app`), per-run results
(:mod:`fedqhd.server.results`) and an in-process Grid for Ray-free runs
(:mod:`fedqhd.server.inprocess`)."""
