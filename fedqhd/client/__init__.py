"""Client side: the Flower ClientApp (:mod:`fedqhd.client.app`) and the local learners
(:mod:`fedqhd.client.learners`, usable without Flower)."""
