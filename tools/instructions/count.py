"""One ``shoal loadtest`` run (one shard, in this process) whose timed section is
bracketed by calls of ``time.process_time_ns``, so that ``valgrind --tool=callgrind
--dump-before=time_process_time_ns`` counts it apart (its second part).

usage: python count.py NODES PODS [TEMPLATES] (run by count.sh, under callgrind). With
TEMPLATES, the pods and nodes of ``shoal loadtest scale --shards 0 --templates
TEMPLATES`` (:mod:`loadtest.scale`, one shard in this process); without, those of
``shoal loadtest`` (:mod:`loadtest.driver`)."""

import asyncio
import sys
import time
import types

from events.memory import MemoryLog
from loadtest import driver, sharded
from loadtest.driver import LoadShape, run_loadtest
from loadtest.scale import ScaleShape, run_configuration
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
    if len(sys.argv) > 3:
        # the scale harness reads this process's CPU through loadtest.sharded's clock
        sharded.time = types.SimpleNamespace(  # type: ignore[attr-defined]
            process_time=_process_time,
            perf_counter=time.perf_counter,
            time_ns=time.time_ns,
            monotonic=time.monotonic,
        )
        shape = ScaleShape(nodes=nodes, pods=pods, shards=0, templates=int(sys.argv[3]))
        scaled = asyncio.run(run_configuration(shape))
        print(scaled["processes"][0]["cpu_us_per_pod"], scaled["bound"])
        return
    result = asyncio.run(run_loadtest(LoadShape(nodes=nodes, pods=pods), MemoryLog()))
    print(result["cpu_microseconds_per_pod"], result["bound"])


if __name__ == "__main__":
    main()
