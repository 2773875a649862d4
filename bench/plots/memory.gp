# Memory held against cached tokens (scaling_bench, series "memory"). Run from the
# directory holding memory.dat (bench/results):
#   gnuplot ../plots/memory.gp   -> memory.svg
# Left: MiB (raw tensor bytes, what the trie and live caches hold, process RSS growth);
# right: their ratios to raw, with the 1.5x target.
set terminal svg size 800,500 dynamic enhanced font 'sans,12' background rgb 'white'
set output 'memory.svg'
set title 'Memory against cached tokens'
set xlabel 'cached tokens'
set ylabel 'MiB'
set y2label 'ratio to raw tensor bytes'
set logscale x 2
set logscale y
set ytics nomirror
set y2tics
set y2range [0:2]
set grid
set autoscale xfix
set key top left
plot 'memory.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#7f7f7f' title 'raw tensor bytes', \
     '' using 1:3 with linespoints lw 2 pt 5 lc rgb '#1f77b4' \
       title 'held: snapshots + live caches', \
     '' using 1:4 with linespoints lw 1 pt 4 lc rgb '#ff7f0e' title 'RSS growth', \
     '' using 1:5 axes x1y2 with lines lw 1 dt 2 lc rgb '#1f77b4' title 'held / raw (right)', \
     '' using 1:6 axes x1y2 with lines lw 1 dt 2 lc rgb '#ff7f0e' title 'RSS / raw (right)', \
     1.5 axes x1y2 with lines lw 1 lc rgb '#d62728' title 'target 1.5x (right)'
