# Plot of bench/dp-vs-ddp.sh: throughput against replicas/ranks (left), the time split of one
# step (middle) and the CPU time one step costs, all threads of all processes (right; unlike
# throughput it does not depend on the CPU share a shared machine gives the job). Called as: gnuplot -e "dir='OUT'; k=2; title='...'" bench/dp-vs-ddp.gp
# Reads dir/throughput.dat (blocks: dp, ddp, ddp-nosync), dir/split.dat and dir/cpu.dat; writes dir/dp-vs-ddp.png.
if (!exists("dir")) dir = "."
if (!exists("k")) k = 2
if (!exists("title")) title = ""

set terminal pngcairo size 1400,500 font "sans,10"
set output dir."/dp-vs-ddp.png"
set multiplot layout 1,3 title "DP (threads, one process) vs DDP (MPI ranks): ".title

# ---- left: throughput
stats dir."/throughput.dat" index 1 every ::0::0 using 2 nooutput name "DDP1"
set title "throughput (median; bars: min-max of the repetitions)"
set xlabel "replicas (DP) / ranks (DDP)"
set ylabel "samples/s"
set xrange [0.5:k+0.5]
set xtics 1
set yrange [0:*]
set key top left
set grid ytics
plot dir."/throughput.dat" index 0 using 1:2:3:4 with yerrorlines lw 2 pt 7 title "DP", \
     ""                    index 1 using 1:2:3:4 with yerrorlines lw 2 pt 5 title "DDP", \
     ""                    index 2 using 1:2:3:4 with yerrorbars lw 2 pt 9 ps 1.5 title "DDP without gradient sync", \
     DDP1_max * x with lines dt 2 lc rgb "gray" title "linear (N x DDP with 1 rank)"

# ---- right: time split
set title "time per step (ms), the median run"
set xlabel ""
set ylabel "ms per step"
set xrange [*:*]
set autoscale x
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.6
set key below horizontal maxcols 3
set xtics norotate font ",9"
plot dir."/split.dat" using 2:xtic(1) title "compute (fwd+bwd)" lc rgb "#4e79a7", \
     "" using 3 title "param copy (DP)" lc rgb "#f28e2b", \
     "" using 4 title "grad gather (DP)" lc rgb "#e15759", \
     "" using 5 title "exposed allreduce (DDP)" lc rgb "#b07aa1", \
     "" using 6 title "data wait" lc rgb "#76b7b2", \
     "" using 7 title "other (optimizer step, ...)" lc rgb "#bab0ac"

# ---- right: CPU cost of a step (absent when no run had a complete CPU window)
stats dir."/cpu.dat" using 2 nooutput name "CPU"
if (exists("CPU_max")) {
  set title "CPU time per step (ms), all threads, median"
  set ylabel "CPU ms per step"
  set yrange [0:CPU_max * 1.15]
  set style histogram clustered gap 1
  set boxwidth 0.9 relative
  set key off
  plot dir."/cpu.dat" using 2:xtic(1) lc rgb "#59a14f" notitle, \
       "" using 0:2:(sprintf("%.0f", $2)) with labels offset 0,0.7 notitle
}
unset multiplot
