"""fedqhd: federated reinforcement learning with hyperdimensional encoders on Flower.

Parts: ``fedqhd.server`` (ServerApp), ``fedqhd.client`` (ClientApp, learners),
``fedqhd.strategies`` (Flower strategies), ``fedqhd.privacy`` (zCDP tools), and a
numeric core that works without Flower (``encoders``, ``readout``, ``envs``,
``data``, ``pool``).
"""

__version__ = "0.1.0"
