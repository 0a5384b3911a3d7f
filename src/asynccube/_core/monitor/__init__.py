"""The loop monitor for running services: event-loop lag percentiles, the worst step and
the code behind it (:mod:`.loop`), on asyncio and trio.

May import: the foundation (``errors``) and the pytest plugin's light half
(``_asynccube_pytest.lagprobe``: the step hooks and culprit naming it shares with the
pytest plugin's lag probe, standard library only).
"""

from __future__ import annotations

from .loop import LoopLagReport, LoopMonitor, SlowStep

__all__ = ["LoopLagReport", "LoopMonitor", "SlowStep"]
