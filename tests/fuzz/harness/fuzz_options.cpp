// Sanitizer defaults compiled into every fuzz and replay executable (the environment's
// ASAN_OPTIONS still wins). A single allocation over 256 MiB returns null instead of touching
// memory: lockstep's allocator then throws std::bad_alloc, which the targets report as a finding
// (a small file that makes a reader ask for gigabytes), except the model-spec target, where a
// spec may legitimately ask for more memory than there is.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1:max_allocation_size_mb=256";
}

// HDF5 1.10.8 leaks memory inside H5Fopen when it fails on a damaged object header
// (docs/FUZZING.md, finding H1): lockstep cannot free it, and reporting it on every such input
// would stop the fuzzer at the first damaged file. Leaks through lockstep's own code are still
// reported, and an HDF5 id that lockstep leaves open is caught by the targets' open-object check.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libhdf5\n";
}
