"""Thresholds shared by every verdict (search's and the log analysis'), in one place so
the two never disagree, and importable without loading Optuna or torch."""

AU_HEALTHY = 0.90      # MLPerf Storage: input-bound below this accelerator utilization
AT_CEILING = 0.85      # reaching this share of a ceiling means that ceiling is the limit
CPU_SATURATED = 0.85   # share of all usable cores
DISK_BUSY_PCT = 80.0   # %util above which the disk is the busy party
QUOTA_THROTTLED = 0.50  # share of a CPU quota's periods throttled: the quota holds the job back
