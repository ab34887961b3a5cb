"""Log lines: the engine's log read and judged (log_tail, late_errors, stages), and the one escaping
rule for the worker's own lines (log_escape)."""
