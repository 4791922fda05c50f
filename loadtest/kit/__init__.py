"""The toolkit of the Python tools: the benchmark (loadtest/bench,
bench_ab.py), the ladder (loadtest/ladder), the load-test reports
(report.py, check_invariants.py) and the tests (tests/seckill_server.py and
the programs that import it). Each module is the only copy of what it does:

  base     ROOT, BUILD, KitError, HTTP_TIMEOUT
  proc     run() a command (KitError on failure), free_ports(), wait_port(),
           wait_for() a condition, proc_status() / pid_alive() / wait_gone()
           from /proc, signal_all(), stop_pid(), stop_children(), with_settings() (an
           environment), write_atomic() (a file)
  cpu      machine_cpu() and CpuMeter: CPU seconds per group of processes
  idle     IdleSampler: what a run's free CPUs wait on (the WAL's flush,
           Redis's fsync, a row lock, round trips between processes)
  stack    Stack: scripts/stack.sh in a RUN_DIR of its own (start, stop,
           restart-instances with other settings, rolling-restart, a service
           stopped and started, its env file, PIDs; with REDIS_HA=1 the
           Sentinels' master, a failover awaited, a node restarted as a replica)
  redis    redis_cli() (the one redis-cli wrapper), redis_role(),
           redis_info_count(), start_redis_server(), wait_replica(), set_aof(),
           stream_unsettled() and drain_stream() (the Redis-first orders stream)
  nginx    start_nginx() (nginx/gen-conf.sh's configuration, nginx on it),
           stop_nginx(), access_log() (its log), answered_by() (who answered a
           logged request: an instance's name, or NGINX_EDGE)
  pg       psql() and psql_value(): SQL on stdin, rows of strings, a timeout
  http     request() and Client: JSON requests with timeouts; call(): the
           same for tools, any failure a KitError; voucher_body()
  load     parse_ab(), ab_times() (ab -g), parse_wrk() and run_wrk() (wrk
           with loadtest/wrk_sale.lua)
  figures  percentile() (nearest rank), median_of(), spread_of(),
           fmt_count(), fmt_ms(), table(); timelines per second
  charts   gnuplot(), bar_chart_head(); the HTML reports' writer: html_page(),
           svg_chart(), timeline_html()

Everything is importable from the package itself (import kit; kit.psql(...)).
Importable from anywhere: loadtest/ on sys.path (the tests insert it). Python 3
standard library only.
"""

from .base import BUILD, HTTP_TIMEOUT, LOADTEST, ROOT, KitError  # noqa: F401
from .charts import (HTML_STYLE, bar_chart_head, esc, gnuplot, html_page,  # noqa: F401
                     svg_chart, timeline_html, verdict, write_html)
from .cpu import IRQ_IN_PROCESS_TIME, CpuMeter, machine_cpu, steal_pct  # noqa: F401
from .idle import CAUSES as IDLE_CAUSES, LABEL as IDLE_LABEL, REMEDY as IDLE_REMEDY, IdleSampler  # noqa: F401
from .idle import dominant as idle_dominant  # noqa: F401
from .figures import (Col, dig, fmt_count, fmt_ms, median_of, parse_timeline,  # noqa: F401
                      percentile, spread_of, table, timeline_from_entries,
                      timeline_from_samples, values_at)
from .http import (Client, Response, _address, call, encode_body, make_response,  # noqa: F401
                   request, status_of, voucher_body)
from .load import WRK_LUA, ab_times, parse_ab, parse_wrk, run_wrk  # noqa: F401
from .nginx import (ACCESS_RE, GEN_CONF, NGINX_EDGE, AccessEntry, access_log, start_bare_nginx,  # noqa: F401
                    answered_by, bare_conf, callgrind_instructions, edge_answered, start_nginx,
                    stop_nginx, write_conf)
from .pg import commit_waits, psql, psql_value  # noqa: F401
from .proc import (cmdline, free_ports, pid_alive, proc_status, proc_tree, run,  # noqa: F401
                   signal_all, stop_children, stop_pid, wait_for, wait_gone, wait_port, with_settings, write_atomic)
from .redis import (drain_stream, redis_cli, redis_info_count, redis_role,  # noqa: F401
                    set_aof, start_redis_server, stream_unsettled, wait_replica)
from .stack import (STACK_SCRUB, STACK_SH, Stack, read_stack_env, stack_env,  # noqa: F401
                    stack_pids)
