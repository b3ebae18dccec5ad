#!/usr/bin/env bash
# The hostile-input sweep of docs/ROBUSTNESS.md: runs each bad or careless command line against a
# tiny synthetic data set and writes one line per case, "id<TAB>exit status<TAB>what it said", to
# OUT. Run it with two builds (before and after a change) and compare the files.
#   bench/hostile-inputs.sh BUILD OUT.tsv      (OLD_SHARD=<an older lockstep-shard> adds the case
#                                               of NaN statistics written by an older importer)
# Needs mpirun and setpriv (util-linux); as root, the permission cases run as user nobody.
set -u
BUILD=$(cd "${1:?usage: hostile-inputs.sh BUILD OUT.tsv}" && pwd); OUT=$(realpath "${2:?usage: hostile-inputs.sh BUILD OUT.tsv}")
T=$BUILD/apps/lockstep-train; S=$BUILD/apps/lockstep-shard; B=$BUILD/apps/lockstep-bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
W=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-hostile.XXXXXX"); chmod 755 "$W"; cd "$W"
trap 'chmod -R u+rwx "$W"; rm -rf "$W"' EXIT
: > "$OUT"
python3 - <<'PY'
import random, math
random.seed(3)
def write(name, n, nan_at=None):
    with open(name,'w') as f:
        for i in range(n):
            c=i%4
            xs=[(1.0 if k%4==c else 0)+random.uniform(-1,1) for k in range(8)]
            if nan_at is not None and i==nan_at: xs[2]=float('nan')
            f.write(str(c)+','+','.join('%.3f'%x if not math.isnan(x) else 'nan' for x in xs)+'\n')
write('train.csv',128); write('test.csv',32); write('nan.csv',128,nan_at=5)
PY
$S csv --file=train.csv --label-column=0 --shape=8 --classes=4 --out=data --name=train --shards=2 >/dev/null 2>&1
$S csv --file=test.csv --label-column=0 --shape=8 --classes=4 --out=data --name=test --shards=1 >/dev/null 2>&1
cat > base.ini <<INI
[data]
train = $W/data/train
test = $W/data/test
[model]
spec = mlp:16
[train]
epochs = 2
global_batch = 16
threads = 1
[log]
progress = lines
INI
sed 's/^test = .*/test =/' base.ini > notest.ini
msg() { tr '\n' ' ' < "$1" | sed 's/lockstep-train: rank 0\/[0-9] ([^)]*) //; s/  */ /g' | cut -c1-600; }
run() {  # run ID cmd...
  local id=$1; shift
  timeout -k 5 90 "$@" > out.txt 2> err.txt; local rc=$?
  printf '%s\t%s\t%s\n' "$id" "$rc" "$(msg err.txt | tail -c 600)" >> "$OUT"
}
tr1() { run "$1" "$T" --config base.ini "${@:2}"; }
tn() { run "$1" "$T" --config notest.ini "${@:2}"; }
# ---- command line and config
printf '[train]\nepoch = 3\n' > unk.ini;                                   run cfg-unknown-key "$T" --config unk.ini
tr1 cli-misspelled --optim.lrr=0.1
tr1 cli-empty-value --data.test= --train.epochs=1
printf '[train]\nepochs = 3\nseed = 1\n[train]\nepochs = 5\n' > dup.ini;  run cfg-duplicate-key "$T" --config dup.ini --data.train=$W/data/train --data.test= --train.global_batch=16 --train.threads=1
run cli-two-configs "$T" --config base.ini --config dup.ini
run cli-missing-config "$T" --config nope.ini
run cli-config-is-dir "$T" --config data
run cli-positional "$T" base.ini
tr1 cli-epochs-text --train.epochs=abc
tr1 cli-epochs-zero --train.epochs=0
tr1 cli-epochs-int64max --train.epochs=9223372036854775807
tr1 cli-epochs-overflow --train.epochs=9223372036854775808
tr1 cli-lr-negative --optim.lr=-1
tr1 cli-lr-nan --optim.lr=nan
tr1 cli-lr-huge --optim.lr=1e39 --train.epochs=1
tr1 cli-threads-huge --train.threads=4294967297 --train.epochs=1
tr1 cli-budget-huge --data.memory_budget_mb=9223372036854775807 --train.epochs=1
tr1 cli-bucket-huge --dist.bucket_mb=1e300 --train.epochs=1
run cli-batch-not-divisible mpirun -np 2 --oversubscribe --bind-to none "$T" --config base.ini --train.global_batch=15
tr1 cli-batch-larger-than-data --train.global_batch=4096
run cli-dp-under-mpirun mpirun -np 2 --oversubscribe --bind-to none "$T" --config base.ini --train.parallel=dp
tr1 cli-cuda-without-gpu --train.device=cuda
tr1 cli-momentum-one --optim.momentum=1
tr1 cli-optimizer-typo --optim.name=adam
tr1 cli-eval-only-no-ckpt --eval-only
tr1 cli-help-with-value --help=yes
head -c 300 /dev/urandom > bin.ini;                                        run cfg-binary-file "$T" --config bin.ini
printf '[train]\nepochs\n' > noeq.ini;                                     run cfg-line-without-equals "$T" --config noeq.ini
tr1 cli-data-train-empty --data.train=
# ---- data
tr1 data-missing --data.train=$W/nope/train
mkdir -p empty; tr1 data-empty-folder --data.train=$W/empty
echo "not hdf5" > fake.h5; tr1 data-not-hdf5 --data.train=$W/fake.h5
mkdir -p trunc; cp data/train-00000-of-00002.h5 trunc/; head -c 3000 data/train-00001-of-00002.h5 > trunc/train-00001-of-00002.h5; tr1 data-truncated-shard --data.train=$W/trunc/train
mkdir -p miss; cp data/train-00000-of-00002.h5 miss/; tr1 data-missing-shard --data.train=$W/miss/train
mkdir -p two; cp data/train-0000* two/; $S csv --file=test.csv --label-column=0 --shape=8 --classes=4 --out=two --name=other --shards=2 >/dev/null 2>&1; tr1 data-two-sets-in-folder --data.train=$W/two
$S csv --file=nan.csv --label-column=0 --shape=8 --classes=4 --out=nandata --name=train --shards=2 > nanshard.log 2>&1; echo "$?" > nanshard.rc
printf '%s\t%s\t%s\n' shard-csv-with-nan "$(cat nanshard.rc)" "$(msg nanshard.log | tail -c 400)" >> "$OUT"
if [ -n "${OLD_SHARD:-}" ]; then
  "$OLD_SHARD" csv --file=nan.csv --label-column=0 --shape=8 --classes=4 --out=mainnan --name=train --shards=2 >/dev/null 2>&1
  tn data-nan-mean-shard-from-old-importer --data.train=$W/mainnan/train
fi
cp -r data locked; chmod 000 locked/train-00000-of-00002.h5
run data-unreadable-shard setpriv --reuid=65534 --regid=65534 --clear-groups "$T" --config notest.ini --data.train=$W/locked/train --log.progress=none
cp -r data closed; chmod 700 closed
run data-unreadable-folder setpriv --reuid=65534 --regid=65534 --clear-groups "$T" --config notest.ini --data.train=$W/closed --log.progress=none
printf '0,1,2\n1,2,3\n' > small.csv; $S csv --file=small.csv --label-column=0 --shape=2 --classes=4 --out=odd --name=test --shards=1 >/dev/null 2>&1
tr1 data-test-shape-differs --data.test=$W/odd/test
printf '9,1,2,3,4,5,6,7,8\n' > badlabel.csv; $S csv --file=badlabel.csv --label-column=0 --shape=8 --classes=4 --out=bl --name=x --shards=1 > bl.log 2>&1; printf '%s\t%s\t%s\n' shard-label-out-of-range "$?" "$(msg bl.log)" >> "$OUT"
tr1 model-spec-garbage --model.spec=mlp:abc
tr1 model-spec-conv-on-flat --model.spec='conv(8,3)-flatten-linear(4)'
tr1 model-too-large --model.spec=mlp:2000000000
# ---- checkpoints and resume
tr1 ck-first-run --checkpoint.dir=$W/ck --checkpoint.every_steps=4 --train.epochs=1 --log.progress=none
cp -r ck ck-bad; for f in ck-bad/ckpt-*.h5; do truncate -s 700 $f; done
tr1 ck-auto-all-unreadable --checkpoint.dir=$W/ck-bad --train.resume=auto
ls ck-bad | tr '\n' ' ' > ck-bad.after; printf '%s\t-\t%s\n' ck-auto-all-unreadable-files-after "$(cat ck-bad.after)" >> "$OUT"
cp -r ck ck-empty-resume; tr1 ck-empty-resume-over-existing --checkpoint.dir=$W/ck-empty-resume --checkpoint.every_steps=4
ls ck-empty-resume | tr '\n' ' ' > a; printf '%s\t-\t%s\n' ck-empty-resume-files-after "$(cat a)" >> "$OUT"
cp -r ck ck-fresh; tr1 ck-resume-fresh --checkpoint.dir=$W/ck-fresh --train.resume=fresh --train.epochs=1
ls -R ck-fresh | tr '\n' ' ' > a; printf '%s\t-\t%s\n' ck-fresh-files-after "$(cat a)" >> "$OUT"
cp -r ck ck-older; first=$(ls ck-older/ckpt-*.h5 | head -1); tr1 ck-resume-older-file --checkpoint.dir=$W/ck-older --train.resume=$W/$first
tr1 ck-resume-not-checkpoint --train.resume=$W/data/train-00000-of-00002.h5
tr1 ck-resume-missing --train.resume=$W/ck/ckpt-99999999.h5
echo x > afile; tr1 ck-dir-under-file --checkpoint.dir=$W/afile/ck --checkpoint.every_steps=1000
mkdir -p rodir; chmod 555 rodir
run ck-dir-no-permission setpriv --reuid=65534 --regid=65534 --clear-groups "$T" --config base.ini --checkpoint.dir=$W/rodir/ck --log.progress=none
last=$(ls ck/ckpt-*.h5 | tail -1)
tr1 ck-resume-other-model --train.resume=$W/$last --model.spec=mlp:32
tr1 ck-resume-other-optimizer --train.resume=$W/$last --optim.name=adamw
tr1 ck-keep-zero --checkpoint.dir=$W/ck0 --checkpoint.keep=0
tr1 out-metrics-under-file --log.metrics=$W/afile/m.jsonl
mkdir -p mdir; tr1 out-metrics-is-folder --log.metrics=$W/mdir
tr1 out-export-under-file --checkpoint.export=$W/afile/p.h5 --train.epochs=1
cp -r ck ck-eval; tr1 ck-eval-only-auto --eval-only --checkpoint.dir=$W/ck-eval --train.resume=auto
# ---- the checkpoint folder and the run's outputs (issue 31)
hdr() { head -c 21 "$1" | tr -d '\0' | tr -c '[:print:]' '?'; }  # "LOCKSTEP-CHECKPOINT 1", or what replaced it
cp -r ck ck-newer; newest=$(ls ck-newer/ckpt-*.h5 | tail -1); printf 2 | dd of=$newest bs=1 seek=20 conv=notrunc 2>/dev/null
tr1 ck-auto-newest-newer-version --checkpoint.dir=$W/ck-newer --train.resume=auto --checkpoint.every_steps=4
printf '%s\t-\t%s\n' ck-auto-newest-newer-version-after "$(ls ck-newer | tr '\n' ' ')$newest: $(hdr $newest)" >> "$OUT"
cp -r ck ck-fresh2; now=$(date +%s)
for s in -1 0 1 2 3; do d=ck-fresh2/replaced-$(date -u -d @$((now + s)) +%Y%m%d-%H%M%S); mkdir -p $d; for f in ck/ckpt-*.h5; do echo "an earlier fresh start's" > $d/${f##*/}; done; done
tr1 ck-fresh-folder-of-that-second-exists --checkpoint.dir=$W/ck-fresh2 --train.resume=fresh --train.epochs=1
printf '%s\t-\t%s\n' ck-fresh-folder-of-that-second-exists-after "$(grep -rl "an earlier fresh start's" ck-fresh2 | wc -l) of 10 earlier files intact; $(ls -d ck-fresh2/replaced-* | wc -l) replaced-* folders" >> "$OUT"
cp -r ck ck-export; ev=$(ls ck-export/ckpt-*.h5 | tail -1)
tr1 out-export-onto-evaluated-checkpoint --eval-only --train.resume=$W/$ev --checkpoint.export=$W/$ev
printf '%s\t-\t%s\n' out-export-onto-evaluated-checkpoint-after "$ev: $(hdr $ev)" >> "$OUT"
cp -r ck ck-mres; mr=$(ls ck-mres/ckpt-*.h5 | tail -1); size=$(stat -c %s $mr)
tr1 out-metrics-onto-resumed-checkpoint --train.resume=$W/$mr --log.metrics=$W/$mr
printf '%s\t-\t%s\n' out-metrics-onto-resumed-checkpoint-after "$mr: $(stat -c %s $mr) bytes (was $size)" >> "$OUT"
cp -r data data-m; size=$(stat -c %s data-m/train-00000-of-00002.h5)
tr1 out-metrics-onto-shard --data.train=$W/data-m/train --log.metrics=$W/data-m/train-00000-of-00002.h5
printf '%s\t-\t%s\n' out-metrics-onto-shard-after "$(stat -c %s data-m/train-00000-of-00002.h5) bytes (was $size)" >> "$OUT"
cp -r data data-ck; tr1 out-checkpoint-dir-is-data-folder --data.train=$W/data-ck/train --data.test= --checkpoint.dir=$W/data-ck --train.epochs=1
printf '%s\t-\t%s\n' out-checkpoint-dir-is-data-folder-after "$(ls -A data-ck | tr '\n' ' ')" >> "$OUT"
tr1 ck-metrics-first-run --checkpoint.dir=$W/ck-m --checkpoint.every_steps=4 --train.max_steps=8 --log.metrics=$W/m.jsonl --log.every=4
n1=$(wc -l < m.jsonl)
tr1 ck-metrics-resumed-run --checkpoint.dir=$W/ck-m --checkpoint.every_steps=4 --train.resume=auto --log.metrics=$W/m.jsonl --log.every=4
printf '%s\t-\t%s\n' ck-metrics-resumed-run-after "m.jsonl: $n1 lines after the first run, $(wc -l < m.jsonl) after the resumed one, $(grep -c '"restart"' m.jsonl) restart record(s)" >> "$OUT"
timeout -k 5 120 "$T" --config notest.ini --checkpoint.dir=$W/ck-lock --checkpoint.every_steps=50 --train.epochs=100000 --log.progress=none --log.metrics=$W/lock.jsonl > lock.out 2>&1 &
tpid=$!; for i in $(seq 200); do grep -q '"loss"' lock.jsonl 2>/dev/null && break; sleep 0.1; done; lpid=$(pgrep -P $tpid)
tr1 ck-second-run-on-a-busy-dir --checkpoint.dir=$W/ck-lock --train.resume=auto --train.max_steps=2 --log.progress=none
printf '%s\t-\t%s\n' ck-second-run-on-a-busy-dir-holder "pid $lpid" >> "$OUT"
kill -KILL $lpid; wait $tpid 2>/dev/null
tr1 ck-lock-left-by-a-killed-run --checkpoint.dir=$W/ck-lock --train.resume=auto --train.max_steps=2 --log.progress=lines
# ---- more
tr1 cli-resume-auto-without-dir --train.resume=auto
tr1 cli-every-minutes-negative --checkpoint.every_minutes=-1
tr1 cli-log-every-zero --log.every=0
tr1 cli-accumulation-not-dividing --train.accumulation=3
tr1 cli-prefetch-zero --data.prefetch=0
tr1 cli-model-spec-empty --model.spec=
tr1 cli-seed-negative --train.seed=-1
printf '[foo]\nbar = 1\n' > sect.ini; run cfg-unknown-section "$T" --config sect.ini
run cli-config-empty-path "$T" --config=
tr1 cli-option-missing-value --data.test
tr1 cli-bool-garbage --train.eval=maybe
tr1 cli-nesterov-without-momentum --optim.nesterov=true --optim.momentum=0
tr1 cli-warmup-longer-than-cosine --optim.schedule=cosine --optim.warmup_steps=100
sed 's/epochs = 2/epochs = 3/' base.ini > other.ini
run cli-ranks-read-different-configs mpirun --oversubscribe --bind-to none -np 1 "$T" --config base.ini : -np 1 "$T" --config other.ini
run ck-resume-2-ranks-written mpirun -np 2 --oversubscribe --bind-to none "$T" --config base.ini --checkpoint.dir=$W/ck2 --train.max_steps=4 --log.progress=none
tr1 ck-resume-1-rank-from-2 --checkpoint.dir=$W/ck2 --train.resume=auto --log.progress=none
tr1 ck-every-steps-with-no-dir --checkpoint.every_steps=2
# ---- stop signals (issue 31): a GPT run stopped by SIGUSR1 (Slurm's preemption warning), alone
# and followed 30 ms later by a SIGTERM; the status must be 3 (kExitRequeue) with a checkpoint.
awk 'BEGIN { srand(7); split("the king saw a river and built one city of stone", w);
  for (p = 0; p < 200; p++) { for (s = 0; s < 20; s++) printf "%s ", w[int(rand() * 11) + 1]; printf "\n\n" } }' > corpus.txt
$S text --input=corpus.txt --tokenizer=bytes --out=text --name=train --shards=1 --documents=paragraph >/dev/null 2>&1
signalled() {  # signalled ID SECOND_SIGNAL(none|TERM)
  local id=$1 ck=$W/ck-$1; rm -rf "$ck"
  "$T" --config base.ini --data.train=$W/text/train --data.test= --model.spec=gpt-tiny \
    --train.global_batch=32 --train.max_steps=300 --train.epochs=100 --optim.name=adamw \
    --checkpoint.dir="$ck" --checkpoint.every_steps=1000 > out.txt 2> err.txt &
  local pid=$!; sleep 2.5; kill -USR1 $pid
  [ "$2" = TERM ] && { sleep 0.03; kill -TERM $pid 2>/dev/null; }
  wait $pid; local rc=$?
  printf '%s\t%s\t%s\n' "$id" "$rc" "$(msg err.txt | tail -c 400) [checkpoints: $(ls "$ck" 2>/dev/null | tr '\n' ' ')]" >> "$OUT"
}
for i in 1 2 3; do signalled sig-gpt-usr1-$i none; signalled sig-gpt-usr1-then-term-$i TERM; done
# ---- bench
run bench-unknown-flag timeout 20 "$B" ops --threads=1 --rep=3
run bench-positional timeout 20 "$B" mlp 256
# ---- issue 31: --print-config round trip, lockstep-generate's options
# A value holding '#' or blanks, printed and fed back: the same data set and outputs, or an error.
mkdir -p 'set#2' other; cp data/train-* 'set#2/'; cp data/test-* other/; ln -s other set
"$T" --config notest.ini --data.train="$W/set#2" --checkpoint.dir="$W/out#2" --checkpoint.every_steps=8 --print-config > pc.ini 2>/dev/null
run cfg-print-config-hash-readback "$T" --config pc.ini --train.epochs=1
printf '%s\t-\t%s\n' cfg-print-config-hash-files-after "$(ls -d out* 2>/dev/null | tr '\n' ' ')" >> "$OUT"
"$T" --config notest.ini --checkpoint.dir=' ck3 ' --print-config > pc3.ini 2>/dev/null
printf '%s\t-\t%s\n' cfg-print-config-blanks-readback "$("$T" --config pc3.ini --print-config 2>&1 | grep '^dir')" >> "$OUT"
G=$BUILD/apps/lockstep-generate
python3 -c "
import random; random.seed(5); w='the a king river stone lamp saw kept'.split()
print('\n\n'.join(' '.join(random.choice(w) for _ in range(30)) for _ in range(40)))" > corpus.txt
$S text --input=corpus.txt --tokenizer=bytes --out=text --name=train --shards=2 --val-fraction=0.1 --documents=paragraph >/dev/null 2>&1
"$T" --data.train=$W/text/train --data.test= --model.spec='gpt(layers=1,heads=2,dim=16,ctx=16)' --train.global_batch=4 --train.max_steps=2 --train.threads=1 --train.eval=false --checkpoint.dir=$W/gck --checkpoint.every_steps=2 --log.progress=none >/dev/null 2>&1
gk=$W/gck/ckpt-00000002.h5
gen() { run "$1" "$G" --checkpoint=$gk --prompt='the ' --tokens=16 "${@:2}"; }
gen gen-tokens-inf --tokens=inf
gen gen-tokens-1e30 --tokens=1e30
gen gen-seed-1e30 --seed=1e30
gen gen-seed-inf --seed=inf
gen gen-threads-huge --threads=100000
same() {  # same ID ARGS-A -- ARGS-B: whether the two seeds printed the same text
  local id=$1; shift; local a=() ; while [ "$1" != -- ]; do a+=("$1"); shift; done; shift
  "$G" --checkpoint=$gk --prompt='the ' --tokens=16 --ids "${a[@]}" > a.txt 2>&1
  "$G" --checkpoint=$gk --prompt='the ' --tokens=16 --ids "$@" > b.txt 2>&1
  printf '%s\t-\t%s\n' "$id" "$(cmp -s a.txt b.txt && echo "same text as $*" || echo "differs from $*: ids $(tail -n1 b.txt)")" >> "$OUT"
}
same gen-seed-uint64max --seed=18446744073709551615 -- --seed=0
same gen-seed-2pow53plus1 --seed=9007199254740993 -- --seed=9007199254740992
