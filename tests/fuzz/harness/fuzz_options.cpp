// Sanitizer defaults compiled into every fuzz and replay executable (the environment's
// ASAN_OPTIONS still wins). A single allocation over 256 MiB returns null instead of touching
// memory: lockstep's allocator then throws std::bad_alloc, which the targets report as a finding
// (a small file that makes a reader ask for gigabytes), except the model-spec target, where a
// spec may legitimately ask for more memory than there is.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1:max_allocation_size_mb=256";
}
