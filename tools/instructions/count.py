"""One ``shoal loadtest`` run (one shard, in this process) whose timed section is
bracketed by calls of ``time.process_time_ns``, so that ``valgrind --tool=callgrind
--dump-before=time_process_time_ns`` counts it apart (its second part).

usage: python count.py NODES PODS (run by count.sh, under callgrind)"""

import asyncio
import sys
import time
import types

from events.memory import MemoryLog
from loadtest import driver
from loadtest.driver import LoadShape, run_loadtest
from shards.cli import _tune_gc


def _process_time() -> float:
    time.process_time_ns()  # the mark callgrind splits its counts at
    return time.process_time()


def main() -> None:
    _tune_gc()  # as the command line does
    driver.time = types.SimpleNamespace(  # type: ignore[attr-defined]
        process_time=_process_time, perf_counter=time.perf_counter
    )
    nodes, pods = int(sys.argv[1]), int(sys.argv[2])
    result = asyncio.run(run_loadtest(LoadShape(nodes=nodes, pods=pods), MemoryLog()))
    print(result["cpu_microseconds_per_pod"], result["bound"])


if __name__ == "__main__":
    main()
