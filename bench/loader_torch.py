#!/usr/bin/env python3
"""The peers of bench/loader-vs-torch.sh (bench-only): decode + random-resized-crop + flip to
SIZE x SIZE uint8 from a folder of JPEGs (ImageFolder layout), on one core.

  loader_torch.py torchvision --root DIR [--size 224] [--batch 32] [--epochs 3]
      torchvision.datasets.ImageFolder with Compose([RandomResizedCrop(SIZE),
      RandomHorizontalFlip(), PILToTensor()]) in a DataLoader with num_workers=0 (the work in
      this process, on one core) and torch.set_num_threads(1). PIL is whatever the environment
      has: pillow-simd where bench/install-torch-peer.sh images installed it (its SIMD resize).
      RandomResizedCrop crops, then resizes with PIL's antialiased bilinear; PIL's JPEG decoder
      is libjpeg-turbo and, given the crop after decoding, decodes at full size (torchvision
      asks for no draft mode).
  loader_torch.py dali --root DIR ...
      NVIDIA DALI's CPU pipeline, num_threads=1: fn.readers.file, then
      fn.decoders.image_random_crop (decoding only the region of interest, DALI's fastest CPU
      path), fn.resize to SIZE x SIZE, fn.flip with a coin; batch --batch, device_id=None.

Each prints one JSON line: images/s (wall) and the process's CPU seconds per image over --epochs
whole passes after one warm-up pass, and the library versions.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def torchvision_epochs(a):
    import PIL
    import torch
    import torchvision
    from torchvision import transforms as T
    torch.set_num_threads(1)
    ds = torchvision.datasets.ImageFolder(a.root, transform=T.Compose([
        T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.PILToTensor()]))
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=0)

    def epoch():
        n = 0
        for x, _ in dl:
            assert x.dtype == torch.uint8 and x.shape[1:] == (3, a.size, a.size)
            n += x.shape[0]
        return n
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                "pil": PIL.__version__}
    return epoch, versions


def dali_epochs(a):
    import nvidia.dali as dali
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    @dali.pipeline_def(batch_size=a.batch, num_threads=1, device_id=None, seed=1)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=a.root, random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=a.size, resize_y=a.size)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images, labels

    p = pipe()
    p.build()
    size = p.epoch_size("reader")

    def epoch():
        n = 0
        while n < size:
            images, _ = p.run()
            n += len(images)
        return n
    return epoch, {"dali": dali.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("peer", choices=["torchvision", "dali"])
    ap.add_argument("--root", required=True)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    epoch, versions = (torchvision_epochs if a.peer == "torchvision" else dali_epochs)(a)
    epoch()  # warm-up: file cache, allocations
    rates, cpu = [], []
    for _ in range(a.epochs):
        t0, c0 = time.perf_counter(), cpu_seconds()
        n = epoch()
        rates.append(n / (time.perf_counter() - t0))
        cpu.append((cpu_seconds() - c0) / n)
    print(json.dumps({"peer": a.peer, "images_per_s": statistics.median(rates),
                      "images_per_s_per_epoch": rates,
                      "cpu_ms_per_image": statistics.median(cpu) * 1e3, "images": n,
                      "size": a.size, "batch": a.batch, **versions}))


if __name__ == "__main__":
    main()
