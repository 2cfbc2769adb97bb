/* obs/serve_plot.h - `tandem plot --serve SCRAPE_LOG [--out DIR]`: the
 * serving figures (latency percentiles, throughput, KV and prefix cache,
 * expert load over time) from a scrape log, as PNG and SVG
 * (docs/observability.md "Serving").
 *
 * A scrape log is what bench/soak_load.py --scrape-log writes: GET
 * /metrics every interval, each scrape prefixed by a line
 * "# scrape <unix time>".  Percentiles come from the histogram buckets'
 * differences between consecutive scrapes (the interval's observations),
 * rates from the counters' differences over the interval.
 *
 * Exits 0, 1 when a figure could not be written, 2 on bad input (one line
 * naming the file, and the line where it applies). */
#ifndef TANDEM_OBS_SERVE_PLOT_H
#define TANDEM_OBS_SERVE_PLOT_H

/* argv as cmd_plot gets it (argv[0] "plot"), holding --serve. */
int cmd_plot_serve(int argc, char **argv);

#endif
