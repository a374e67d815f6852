"""fedqhd: federated reinforcement learning with hyperdimensional encoders on Flower.

Parts: ``fedqhd.server`` (ServerApp), ``fedqhd.client`` (ClientApp, learners),
``fedqhd.strategies`` (Flower strategies), ``fedqhd.privacy`` (zCDP tools), and a
numeric core that works without Flower (``encoders``, ``readout``, ``envs``,
``data``, ``pool``).

``fedqhd.strategies`` needs only flwr and numpy (``pip install fedqhd``, the light
install); everything else needs the ``full`` extra (``pip install "fedqhd[full]"``).
Nothing is imported here, so ``import fedqhd.strategies`` stays light.
"""

__version__ = "0.1.0"
