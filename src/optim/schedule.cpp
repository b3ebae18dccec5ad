#include "lockstep/optim/schedule.hpp"

#include <cmath>
#include <numbers>

#include "lockstep/core/error.hpp"

namespace lockstep::optim {

LrSchedule::LrSchedule(const ScheduleOptions& options) : options_(options) {
  LOCKSTEP_CHECK(options.base_lr >= 0.0, "lr schedule: base_lr must be non-negative, got ",
                 options.base_lr);
  LOCKSTEP_CHECK(options.warmup_steps >= 0, "lr schedule: warmup_steps must be >= 0, got ",
                 options.warmup_steps);
}

double LrSchedule::lr_at(std::int64_t step) const {
  LOCKSTEP_CHECK(step >= 0, "lr schedule: negative step ", step);
  std::int64_t w = options_.warmup_steps;
  if (step < w) return options_.base_lr * static_cast<double>(step + 1) / static_cast<double>(w);
  return after_warmup(step - w);
}

static std::string warmup_text(const ScheduleOptions& o) {
  return o.warmup_steps > 0 ? str(", warmup=", o.warmup_steps) : std::string();
}

std::string ConstantLr::describe() const {
  return str("constant(lr=", options_.base_lr, warmup_text(options_), ")");
}
double ConstantLr::after_warmup(std::int64_t) const {
  return options_.base_lr;
}

StepLr::StepLr(const ScheduleOptions& options) : LrSchedule(options) {
  LOCKSTEP_CHECK_HINT(options.step_size > 0, "set the step size of the step schedule",
                      "lr schedule 'step': step_size must be positive, got ", options.step_size);
  LOCKSTEP_CHECK(options.gamma > 0.0, "lr schedule 'step': gamma must be positive, got ",
                 options.gamma);
}
std::string StepLr::describe() const {
  return str("step(lr=", options_.base_lr, ", step_size=", options_.step_size,
             ", gamma=", options_.gamma, warmup_text(options_), ")");
}
double StepLr::after_warmup(std::int64_t s) const {
  return options_.base_lr * std::pow(options_.gamma, static_cast<double>(s / options_.step_size));
}

CosineLr::CosineLr(const ScheduleOptions& options) : LrSchedule(options) {
  LOCKSTEP_CHECK_HINT(options.total_steps > options.warmup_steps,
                      "set total_steps to the number of optimizer steps of the run",
                      "lr schedule 'cosine': total_steps (", options.total_steps,
                      ") must exceed warmup_steps (", options.warmup_steps, ")");
  LOCKSTEP_CHECK(options.min_lr >= 0.0 && options.min_lr <= options.base_lr,
                 "lr schedule 'cosine': min_lr must be in [0, base_lr], got ", options.min_lr);
}
std::string CosineLr::describe() const {
  return str("cosine(lr=", options_.base_lr, ", min_lr=", options_.min_lr,
             ", total=", options_.total_steps, warmup_text(options_), ")");
}
double CosineLr::after_warmup(std::int64_t s) const {
  double span = static_cast<double>(options_.total_steps - options_.warmup_steps);
  if (static_cast<double>(s) >= span) return options_.min_lr;
  double c = (1.0 + std::cos(std::numbers::pi * static_cast<double>(s) / span)) / 2.0;
  return options_.min_lr + (options_.base_lr - options_.min_lr) * c;
}

std::unique_ptr<LrSchedule> make_schedule(const ScheduleOptions& options) {
  if (options.kind == "constant") return std::make_unique<ConstantLr>(options);
  if (options.kind == "step") return std::make_unique<StepLr>(options);
  if (options.kind == "cosine") return std::make_unique<CosineLr>(options);
  LOCKSTEP_FAIL_HINT("use constant, step or cosine", "unknown lr schedule '", options.kind, "'");
}

}  // namespace lockstep::optim
