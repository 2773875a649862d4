# Per-request cost against the context length of one conversation (scaling_bench, series
# "context"). Run from the directory holding context.dat (bench/results):
#   gnuplot ../plots/context.gp   -> context.svg
# "minus harness" subtracts what ProductionRunner::Run itself spends per request (copying
# the stored tokens and re-deriving their provenance hashes, O(context)), timed alone: an
# estimate of the manager and caches' own cost.
set terminal svg size 800,500 dynamic enhanced font 'sans,12' background rgb 'white'
set output 'context.svg'
set title 'Per-request cost against context length (32 new prompt tokens + 4 decode steps)'
set xlabel 'context tokens'
set ylabel 'CPU µs per request'
set y2label 'CPU ns per context token'
set logscale x 2
set yrange [0:*]
set logscale y2
set ytics nomirror
set y2tics
set grid
set autoscale xfix
set key top left
plot 'context.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'median (CPU)', \
     '' using 1:3 with linespoints lw 1 pt 6 dt 2 lc rgb '#1f77b4' title 'mean (CPU)', \
     '' using 1:5 with linespoints lw 1 pt 1 lc rgb '#7f7f7f' title 'median (wall)', \
     '' using 1:7 with linespoints lw 2 pt 5 lc rgb '#2ca02c' \
       title 'median minus harness hashing (CPU)', \
     '' using 1:4 axes x1y2 with linespoints lw 1 pt 4 lc rgb '#d62728' \
       title 'CPU ns per context token (right)'
