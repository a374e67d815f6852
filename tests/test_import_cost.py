"""What a run imports: every ClientApp process (a Ray actor per run) and the ServerApp
pay their imports on every run, so a run imports neither scikit-learn (0.6 s: the
encoders follow its estimator protocol without its base classes), dp-accounting (0.45
s: imported when an epsilon is asked for) nor ``scipy.signal``/``scipy.stats`` (0.3
s). BENCHMARKS.md, "Warm Ray cluster", has what this saves per run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

#: modules no plain online or offline FedQHD run needs
UNNEEDED = ("sklearn", "dp_accounting", "scipy.signal", "scipy.stats")

RUN = textwrap.dedent('''
    import json, sys, tempfile
    from fedqhd.client.app import app
    from fedqhd.learners import parse_run_config
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    for protocol in ("online", "offline"):
        cfg = parse_run_config({"protocol": protocol, "encoder": "heterogeneous",
                                "num-server-rounds": 1, "online-episodes": 50,
                                "eval-episodes": 2,
                                "output-dir": tempfile.mkdtemp()})
        final, _ = run_federation(InProcessGrid([app] * 2, run_config=cfg.to_run_config()),
                                  cfg)
        assert final["status"] == "completed", final
    print(json.dumps(sorted(m for m in sys.modules
                            if m in set(sys.argv[1].split(",")))))
''')


def test_a_run_imports_none_of_the_costly_modules_it_does_not_need():
    done = subprocess.run([sys.executable, "-c", RUN, ",".join(UNNEEDED)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
