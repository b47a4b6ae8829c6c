"""The words every layer shares, below the host: backing names and outcomes, sizes, exit
codes, bounded and printable quoting of values, the typed values of scenario files, the log
capture and warning ids, /proc/meminfo's tokenizer, output files, TOML reading."""
