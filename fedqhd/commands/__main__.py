"""``python -m fedqhd.commands``: the ``fedqhd`` command without its installed script."""

import sys

from fedqhd.commands.main import main

sys.exit(main())
