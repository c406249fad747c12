"""``fpsim sweep CONFIG``: recipes x models x seeds end to end, in this process, a local process
pool or on Ray; resumable, and the same combined numbers whichever ran it.

From Python::

    from fpsim_experiments import sweep
    outcome = sweep.run(sweep.load("sweep.toml"), "results/my-sweep", executor="ray")

See docs/sweep.md for the config format and what is written.
"""

from .config import Sweep, from_dict, load
from .runner import Outcome, run

__all__ = ["Outcome", "Sweep", "from_dict", "load", "run"]
