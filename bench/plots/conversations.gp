# Per-request cost against the number of cached conversations (scaling_bench, series
# "conversations"). Run from the directory holding conversations.dat (bench/results):
#   gnuplot ../plots/conversations.gp   -> conversations.svg
# The band is the target: within ±25 % of the median at the smallest N.
set terminal svg size 800,500 dynamic enhanced font 'sans,12' background rgb 'white'
set output 'conversations.svg'
stats 'conversations.dat' using 2 every ::0::0 nooutput
base = STATS_min
set title 'Per-request cost against cached conversations'
set xlabel 'cached conversations'
set ylabel 'CPU µs per request'
set logscale x
set logscale y
set grid
set autoscale xfix
set key top left
set style fill transparent solid 0.15 noborder
plot 'conversations.dat' using 1:(base * 0.75):(base * 1.25) with filledcurves \
       lc rgb '#2ca02c' title 'target: ±25 % of the first point', \
     '' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' \
       title 'measured requests, median (CPU)', \
     '' using 1:3 with linespoints lw 1 pt 6 lc rgb '#1f77b4' dt 2 \
       title 'measured requests, mean (CPU)', \
     '' using 1:6 with linespoints lw 1 pt 1 lc rgb '#7f7f7f' \
       title 'measured requests, median (wall)', \
     '' using 1:5 with linespoints lw 1 pt 4 lc rgb '#ff7f0e' \
       title 'populating requests, mean (CPU)'
