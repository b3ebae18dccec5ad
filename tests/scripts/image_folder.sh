#!/usr/bin/env bash
# A folder of JPEGs and PNGs to a trained model (issue 27, docs/IMAGES.md):
#  1. a generated ImageFolder (four classes that differ by colour, random sizes, JPEG and PNG
#     alternately) converted by 1 rank, by 2 ranks and by 3 threads gives byte-identical shards,
#     raw and encoded (--store=encoded: the files' bytes); the test folder
#     takes the training set's classes and statistics (--train-set); the same files as a
#     path,label list (--list) convert too;
#  2. 2 ranks of lockstep-train learn it: test accuracy >= 0.9 (chance is 0.25), also with
#     augmentation (flip, pad-crop, random-resized-crop), whose reruns are bitwise equal, and from
#     encoded shards (the crop of the original photo), whose evaluation equals the raw shards';
#  3. the bad-file table (raw and encoded storage alike): each broken file is an error naming the
#     file and what is wrong, or with
#     --skip-bad skipped and counted, and the labels of the other files stay right; an empty class
#     folder likewise; under mpirun a failing rank ends every rank, with the message printed once;
#  4. the CIFAR-10 and CIFAR-100 binary importer on generated batches.
# Usage: bash tests/scripts/image_folder.sh BUILD_DIR   Exit: 0 pass, 1 fail.
set -uo pipefail
BUILD=$(cd "${1:?usage: image_folder.sh BUILD_DIR}" && pwd)
SOURCE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHARD="$BUILD/apps/lockstep-shard"
MAKE="$BUILD/tests/make_test_images"
fail() { echo "FAIL: $*" >&2; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-images.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
MPIRUN=(timeout -k 10 300 mpirun -np 2 --oversubscribe --bind-to none)
cd "$WORK" || exit 1

# ---- 1. conversion, 1 rank = 2 ranks
"$MAKE" folder train 40 1 && "$MAKE" folder test 10 2 || fail "cannot generate the image folders"
"$SHARD" images --root=train --out=one --resize=16 --shards=3 >one.log 2>&1 ||
  { cat one.log; fail "1-rank conversion failed"; }
cat one.log
"${MPIRUN[@]}" "$SHARD" images --root=train --out=two --resize=16 --shards=3 >two.log 2>&1 ||
  { cat two.log; fail "2-rank conversion failed"; }
grep -q "160 images of u8 \[3, 16, 16\] (crop), 4 classes; 0 skipped; 2 rank(s)" two.log ||
  { cat two.log; fail "the 2-rank summary does not say 160 images, 4 classes, 2 ranks"; }
# Decoding threads do not change the shards either.
"$SHARD" images --root=train --out=threads --resize=16 --shards=3 --threads=3 >threads.log 2>&1 ||
  { cat threads.log; fail "3-thread conversion failed"; }
for f in one/train-0000{0,1,2}-of-00003.h5; do
  cmp "$f" "two/$(basename "$f")" || fail "$f differs between 1 and 2 ranks"
  cmp "$f" "threads/$(basename "$f")" || fail "$f differs between 1 and 3 threads"
done
# Encoded storage: the same for any number of ranks too.
"$SHARD" images --root=train --out=enc-one --resize=16 --shards=3 --store=encoded >enc-one.log 2>&1 ||
  { cat enc-one.log; fail "1-rank encoded conversion failed"; }
"${MPIRUN[@]}" "$SHARD" images --root=train --out=enc-two --resize=16 --shards=3 --store=encoded \
  >enc-two.log 2>&1 || { cat enc-two.log; fail "2-rank encoded conversion failed"; }
grep -q "160 images of u8 \[3, 16, 16\] (crop, stored encoded: .* of JPEG/PNG" enc-two.log ||
  { cat enc-two.log; fail "the encoded summary does not say 160 images stored encoded"; }
for f in enc-one/train-0000{0,1,2}-of-00003.h5; do
  cmp "$f" "enc-two/$(basename "$f")" || fail "encoded $f differs between 1 and 2 ranks"
done
# JPEGs are stored re-encoded with restart markers unless --jpeg-restarts=0 (docs/IMAGES.md).
grep -q "JPEGs re-encoded losslessly with restart markers" enc-one.log ||
  { cat enc-one.log; fail "the encoded summary does not say the JPEGs were re-encoded"; }
"$SHARD" images --root=train --out=enc-kept --resize=16 --store=encoded --jpeg-restarts=0 \
  >enc-kept.log 2>&1 && grep -q "(the files: .*; as they are)" enc-kept.log ||
  { cat enc-kept.log; fail "--jpeg-restarts=0 did not store the files as they are"; }
"$SHARD" images --root=train --out=enc-bad --resize=16 --store=encoded --jpeg-restarts=yes \
  >restarts.log 2>&1 && fail "--jpeg-restarts=yes was accepted"
grep -q -- "--jpeg-restarts=yes: expected 0 or 1" restarts.log ||
  { cat restarts.log; fail "--jpeg-restarts=yes: no clear error"; }
# The photos bench/loader-vs-torch.sh measures: 4:4:4 by default, 4:2:0 on request (the luma's
# sampling byte of the SOF0 header: 0x11 or 0x22), both stored re-encoded; nothing else accepted.
luma_sampling() { # the 10th byte after FF C0: length (2), precision, height (2), width (2), Nc, id
  od -An -tx1 -v "$1" | tr -s ' \n' ' ' | grep -o 'ff c0\( [0-9a-f]\{2\}\)\{10\}' | head -1 |
    awk '{print $NF}'
}
for kind in 444 420; do
  "$MAKE" photos "photos-$kind/c" 2 $kind >/dev/null || fail "make_test_images photos $kind"
  "$SHARD" images --root="photos-$kind" --out="photos-$kind-set" --resize=64 --store=encoded \
    >"photos-$kind.log" 2>&1 && grep -q "JPEGs re-encoded losslessly" "photos-$kind.log" ||
    { cat "photos-$kind.log"; fail "$kind photos were not stored re-encoded"; }
done
[ "$(luma_sampling photos-444/c/photo0000.jpg)" = 11 ] &&
  [ "$(luma_sampling photos-420/c/photo0000.jpg)" = 22 ] ||
  fail "photos: luma sampling $(luma_sampling photos-444/c/photo0000.jpg) and" \
    "$(luma_sampling photos-420/c/photo0000.jpg), expected 11 (4:4:4) and 22 (4:2:0)"
"$MAKE" photos photos-422 2 422 >/dev/null 2>&1 && fail "make_test_images photos accepted 422"
# Its statistics are the raw set's: both come from the same resize and center crop.
[ "$(grep 'channel' enc-one.log)" = "$(grep 'channel' one.log)" ] ||
  { cat enc-one.log one.log; fail "encoded and raw storage disagree on mean/std"; }
"$SHARD" images --root=train --out=enc-pad --resize=16 --fit=pad --store=encoded >pad.log 2>&1 &&
  fail "--store=encoded converted with --fit=pad"
grep -q "goes with --fit=crop" pad.log || { cat pad.log; fail "--fit=pad with encoded storage: no hint"; }
"$SHARD" inspect enc-two/train >inspect.log 2>&1 && grep -q "storage: *encoded" inspect.log ||
  { cat inspect.log; fail "inspect does not say the set is encoded"; }
grep -q "class 0: blue" one.log && grep -q "class 3: yellow" one.log ||
  fail "classes are not labelled in name order (blue 0 ... yellow 3)"
"${MPIRUN[@]}" "$SHARD" images --root=test --out=two --name=test --resize=16 \
  --train-set=two/train >test.log 2>&1 || { cat test.log; fail "test conversion failed"; }
grep -q "channel 0: mean $(sed -n 's/.*channel 0: mean \([0-9.]*\).*/\1/p' one.log) .*(from --train-set)" test.log ||
  { cat test.log; fail "the test set does not carry the training set's mean/std"; }
# The same images as a path,label list (paths relative to the list's folder), on 2 ranks.
k=0
for c in blue green red yellow; do
  for f in train/$c/*; do echo "$f,$k"; done
  k=$((k + 1))
done >list.txt
"${MPIRUN[@]}" "$SHARD" images --list=list.txt --out=listed --resize=16 --shards=2 >list.log 2>&1 ||
  { cat list.log; fail "--list conversion failed"; }
"$SHARD" inspect listed/train >inspect.log 2>&1 || { cat inspect.log; fail "cannot inspect the listed set"; }
grep -q "samples: *160" inspect.log && [ "$(grep -Ec '^ +[0-3]: +40 ' inspect.log)" = 4 ] ||
  { cat inspect.log; fail "the listed set is not 160 samples, 40 of each of 4 classes"; }
echo "PASS: 1 and 2 ranks wrote identical shards, raw and encoded"

# ---- 2. training: 2 ranks learn the colours
"${MPIRUN[@]}" "$BUILD/apps/lockstep-train" --config "$SOURCE/configs/ci_tiny.ini" \
  --data.train=two/train --data.test=two/test --log.metrics=metrics.jsonl --train.epochs=10 \
  --train.global_batch=32 --log.every=10 >train.log 2>&1 || { cat train.log; fail "lockstep-train failed"; }
acc=$(grep '"event": "final"' metrics.jsonl | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
[ -n "$acc" ] || { cat train.log; fail "no final test accuracy in the metrics file"; }
awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || fail "test accuracy $acc < 0.9 (chance 0.25)"
echo "PASS: 2 ranks trained on the converted ImageFolder: test accuracy $acc"
# With augmentation (part 4): still learns, a rerun gives bitwise the same losses (every random
# choice is a function of seed, epoch and sample), and the losses differ from the plain run's.
AUG=(--data.flip=true --data.pad_crop=2 --data.random_resized_crop=true --data.rrc_scale_min=0.3)
for run in 1 2; do
  "${MPIRUN[@]}" "$BUILD/apps/lockstep-train" --config "$SOURCE/configs/ci_tiny.ini" \
    --data.train=two/train --data.test=two/test --log.metrics=aug$run.jsonl --train.epochs=10 \
    --train.global_batch=32 --log.every=10 "${AUG[@]}" >aug.log 2>&1 || { cat aug.log; fail "augmented training failed"; }
  grep -o '"loss": [0-9.e+-]*' aug$run.jsonl >aug$run.loss
done
cmp -s aug1.loss aug2.loss || fail "two augmented runs logged different losses"
grep -o '"loss": [0-9.e+-]*' metrics.jsonl >plain.loss
cmp -s plain.loss aug1.loss && fail "augmentation changed nothing: the losses equal the plain run's"
acc=$(grep '"event": "final"' aug1.jsonl | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || fail "augmented test accuracy $acc < 0.9"
echo "PASS: augmented training: test accuracy $acc, reruns bitwise equal"
# From encoded shards: the random-resized-crop of the original photos, decoded by the loader.
"${MPIRUN[@]}" "$SHARD" images --root=test --out=enc-two --name=test --resize=16 --store=encoded \
  --train-set=enc-two/train >enc-test.log 2>&1 || { cat enc-test.log; fail "encoded test conversion failed"; }
for run in 1 2; do
  "${MPIRUN[@]}" "$BUILD/apps/lockstep-train" --config "$SOURCE/configs/ci_tiny.ini" \
    --data.train=enc-two/train --data.test=enc-two/test --log.metrics=enc$run.jsonl --train.epochs=10 \
    --train.global_batch=32 --log.every=10 "${AUG[@]}" >enc.log 2>&1 || { cat enc.log; fail "training on encoded shards failed"; }
  grep -o '"loss": [0-9.e+-]*' enc$run.jsonl >enc$run.loss
done
cmp -s enc1.loss enc2.loss || fail "two augmented runs on encoded shards logged different losses"
acc=$(grep '"event": "final"' enc1.jsonl | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || fail "test accuracy $acc < 0.9 on encoded shards"
# No augmentation: evaluation and training samples are the raw shards' bytes, so the losses are.
"${MPIRUN[@]}" "$BUILD/apps/lockstep-train" --config "$SOURCE/configs/ci_tiny.ini" \
  --data.train=enc-two/train --data.test=enc-two/test --log.metrics=enc-plain.jsonl --train.epochs=10 \
  --train.global_batch=32 --log.every=10 >enc.log 2>&1 || { cat enc.log; fail "plain training on encoded shards failed"; }
grep -o '"loss": [0-9.e+-]*' enc-plain.jsonl >enc-plain.loss
cmp -s plain.loss enc-plain.loss || fail "training on encoded shards without augmentation differs from raw"
echo "PASS: 2 ranks trained on encoded shards: test accuracy $acc, reruns bitwise equal, plain = raw"

# ---- 3. the bad-file table
"$MAKE" bad bad || fail "cannot generate the bad files"
expect_error() {  # FILE WHAT: alone in class 'b' beside a good class 'a'
  local file=$1 what=$2 store
  rm -rf case && mkdir -p case/a case/b && cp bad/good.jpg case/a/ && cp -P "bad/$file" case/b/
  for store in raw encoded; do
    "$SHARD" images --root=case --out=case-out --resize=8 --store=$store >case.log 2>&1 &&
      fail "$file: converted without --skip-bad ($store)"
    grep -q "error: case/b/$file: $what" case.log || { cat case.log; fail "$file: no error '$what' ($store)"; }
    rm -rf case-out
    "$SHARD" images --root=case --out=case-out --resize=8 --skip-bad --store=$store >case.log 2>&1 ||
      { cat case.log; fail "$file: --skip-bad failed ($store)"; }
    grep -q "skipped case/b/$file: $what" case.log && grep -q "1 images .* 2 classes; 1 skipped" case.log ||
      { cat case.log; fail "$file: not skipped and counted ($store)"; }
    rm -rf case-out
  done
  echo "  $file: '$what' (raw and encoded)"
}
expect_error truncated.jpg "truncated or corrupt JPEG data"
expect_error corrupt.jpg "corrupt JPEG header"
expect_error empty.jpg "empty file (0 bytes)"
expect_error notes.png "not a JPEG or PNG file (it starts with bytes 74 68 65 73"
expect_error dangling.jpg "cannot open: No such file or directory"
if [ "$(id -u)" != 0 ]; then  # root reads any file
  cp bad/good.jpg bad/locked.jpg && chmod 000 bad/locked.jpg
  expect_error locked.jpg "cannot open: Permission denied"
fi
# Layouts that decode: grayscale and CMYK JPEG, 16-bit and palette PNG, EXIF orientation.
rm -rf case && mkdir -p case/a case/b
cp bad/gray.jpg bad/cmyk.jpg bad/deep16.png bad/palette.png bad/exif6.jpg case/a/
cp -P bad/truncated.jpg bad/empty.jpg bad/notes.png bad/dangling.jpg case/b/ && cp bad/good.jpg case/b/
mkdir case/c  # an empty class folder
"$SHARD" images --root=case --out=case-out --resize=8 >case.log 2>&1 && fail "an empty class folder converted"
grep -q "class folder case/c (class 2) holds no .jpg, .jpeg or .png file" case.log ||
  { cat case.log; fail "the empty class folder is not named"; }
"${MPIRUN[@]}" "$SHARD" images --root=case --out=case-out --resize=8 --shards=2 >case.log 2>&1 &&
  fail "2 ranks converted a folder with an empty class"
[ "$(grep -c "error:" case.log)" = 1 ] || { cat case.log; fail "the error is not printed exactly once"; }
"${MPIRUN[@]}" "$SHARD" images --root=case --out=case-out --resize=8 --shards=2 --skip-bad --threads=3 \
  >case.log 2>&1 || { cat case.log; fail "--skip-bad with every bad file failed"; }
grep -q "6 images .* 3 classes; 4 skipped" case.log && grep -q "empty class folder (kept as a class without samples): case/c" case.log ||
  { cat case.log; fail "the summary does not count 6 images, 4 skipped, the empty class"; }
"$SHARD" inspect case-out/train >inspect.log 2>&1 || { cat inspect.log; fail "cannot inspect"; }
grep -Eq "^ +0: +5 " inspect.log && grep -Eq "^ +1: +1 " inspect.log && grep -Eq "^ +2: +0 " inspect.log ||
  { cat inspect.log; fail "labels are not 5 x class a, 1 x class b, 0 x class c"; }
echo "PASS: the bad-file table"

# ---- 4. CIFAR
"$MAKE" cifar c10 10 20 && "$MAKE" cifar c100 100 30 || fail "cannot generate CIFAR batches"
"$SHARD" cifar --source=c10 --out=c10-out --shards=2 >cifar.log 2>&1 || { cat cifar.log; fail "CIFAR-10 import failed"; }
grep -q "cifar-10 train: 100 images of u8 \[3, 32, 32\], 10 classes, 2 shard(s)" cifar.log &&
  grep -q "cifar-10 test: 20 images" cifar.log || { cat cifar.log; fail "CIFAR-10 counts"; }
"$SHARD" cifar --source=c100 --out=c100-out --labels=coarse >cifar.log 2>&1 || { cat cifar.log; fail "CIFAR-100 import failed"; }
grep -q "cifar-100 train: 30 images of u8 \[3, 32, 32\], 20 classes" cifar.log || { cat cifar.log; fail "CIFAR-100 coarse counts"; }
head -c 5000 c10/data_batch_2.bin >cut.bin && mv cut.bin c10/data_batch_2.bin
"$SHARD" cifar --source=c10 --out=c10-bad >cifar.log 2>&1 && fail "a truncated CIFAR batch converted"
grep -q "c10/data_batch_2.bin: 5000 bytes is not a whole number of 3073-byte records" cifar.log ||
  { cat cifar.log; fail "the truncated batch is not named"; }
echo "PASS: the CIFAR importer"
