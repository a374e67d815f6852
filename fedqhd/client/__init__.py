"""Client side: the Flower ClientApp (:mod:`fedqhd.client.app`), handlers only; the
learners it calls are in :mod:`fedqhd.learners`."""
