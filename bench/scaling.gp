# Plot of bench/scaling-predict.sh: scaling efficiency against ranks, predicted by the scaling
# model (lines) for the published settings with their published points (left), and for
# lockstep's own models (right). Called as: gnuplot -e "dat='OUT/scaling.dat'; png='PNG'" bench/scaling.gp
if (!exists("dat")) dat = "results/scaling/predict/scaling.dat"
if (!exists("png")) png = "docs/img/scaling.png"

# Published points: ranks, efficiency.
# Horovod, docs/benchmarks.rst and README: 512 GPUs (128 servers x 4 Pascal, 25 GbE RoCE);
# 128 GPUs from the README's earlier 32-server version.
$HOROVOD_INCEPTION << EOD
128 0.90
512 0.90
EOD
$HOROVOD_RESNET101 << EOD
128 0.90
512 0.90
EOD
$HOROVOD_VGG16 << EOD
128 0.79
512 0.68
EOD
# PyTorch benchmarks/distributed/ddp/README.md, p50 step vs 1 GPU without DDP (0.097 s, 0.162 s).
$PT_RESNET50 << EOD
2 0.942
4 0.942
8 0.933
16 0.933
EOD
$PT_RESNET101 << EOD
2 0.920
4 0.920
8 0.905
16 0.905
EOD

set terminal pngcairo size 1500,620 font "sans,10"
set output png
set multiplot layout 1,2 title "Scaling efficiency = step time on 1 rank / step time on N ranks (per-rank batch fixed); lines: lockstep's alpha-beta model, points: published"
set logscale x 2
set xrange [1:1100]
set yrange [0:1.05]
set xlabel "GPUs / ranks"
set ylabel "scaling efficiency"
set grid
set key bottom left box opaque font ",9"

set title "Published settings, reproduced in the model (dashed: 80% of the 25 GbE line rate)"
set yrange [0.5:1.02]
plot dat index "horovod-inception3 ring" using 1:2 with lines lw 2 lc 1 title "Inception V3, 25 GbE (model)", \
     dat index "horovod-inception3-80 ring" using 1:2 with lines lw 1 dt 2 lc 1 title "  same at 80% of line rate", \
     $HOROVOD_INCEPTION using 1:2 with points pt 7 ps 1.6 lc 1 title "  Horovod, published", \
     dat index "horovod-resnet101 ring" using 1:2 with lines lw 2 lc 2 title "ResNet-101, 25 GbE (model)", \
     dat index "horovod-resnet101-80 ring" using 1:2 with lines lw 1 dt 2 lc 2 title "  same at 80% of line rate", \
     $HOROVOD_RESNET101 using 1:2 with points pt 5 ps 1.4 lc 2 title "  Horovod, published", \
     dat index "horovod-vgg16 ring" using 1:2 with lines lw 2 lc 7 title "VGG-16, 25 GbE (model)", \
     dat index "horovod-vgg16-80 ring" using 1:2 with lines lw 1 dt 2 lc 7 title "  same at 80% of line rate", \
     $HOROVOD_VGG16 using 1:2 with points pt 9 ps 1.6 lc 7 title "  Horovod, published", \
     dat index "pytorch-resnet50 ring" using 1:2 with lines lw 2 lc 4 title "ResNet-50, V100 NVLink + 4x EDR (model)", \
     $PT_RESNET50 using 1:2 with points pt 11 ps 1.4 lc 4 title "  PyTorch DDP benchmark, published", \
     dat index "pytorch-resnet101 ring" using 1:2 with lines lw 2 lc 6 title "ResNet-101, V100 NVLink + 4x EDR (model)", \
     $PT_RESNET101 using 1:2 with points pt 13 ps 1.4 lc 6 title "  PyTorch DDP benchmark, published"

set title "lockstep's models (predictions; dashed: hierarchical allreduce)"
set yrange [0:1.05]
plot dat index "gpt2-ndr ring" using 1:2 with lines lw 2 lc 1 title "gpt2-124m, H100, NDR x8/node, ring", \
     dat index "gpt2-ndr hierarchical" using 1:2 with lines lw 2 dt 2 lc 1 title "  hierarchical", \
     dat index "gpt2-100gbe ring" using 1:2 with lines lw 2 lc 7 title "gpt2-124m, H100, 100 GbE x1/node, ring", \
     dat index "gpt2-100gbe hierarchical" using 1:2 with lines lw 2 dt 2 lc 7 title "  hierarchical", \
     dat index "mlp-100gbe ring" using 1:2 with lines lw 2 lc 2 title "fashion\\_mlp, CPU ranks (2/node), 100 GbE, ring", \
     dat index "mlp-100gbe hierarchical" using 1:2 with lines lw 2 dt 2 lc 2 title "  hierarchical", \
     dat index "cnn-100gbe ring" using 1:2 with lines lw 2 lc 4 title "fashion\\_cnn, CPU ranks (2/node), 100 GbE, ring", \
     dat index "cnn-100gbe hierarchical" using 1:2 with lines lw 2 dt 2 lc 4 title "  hierarchical"
unset multiplot
