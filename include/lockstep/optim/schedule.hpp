// Learning-rate schedules as pure functions of the 0-based step: lr_at(t) is what the optimizer
// uses for its (t+1)-th update, so a resumed run needs only the step count.
// Optional linear warm-up over the first W steps: lr_at(t) = base_lr * (t + 1) / W for t < W.
// After it, the schedule runs on s = t - W:
//   constant  base_lr
//   step      base_lr * gamma^floor(s / step_size)
//   cosine    min_lr + (base_lr - min_lr) * (1 + cos(pi * s / (total_steps - W))) / 2,
//             and min_lr from s >= total_steps - W on
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace lockstep::optim {

struct ScheduleOptions {
  std::string kind = "constant";  // constant | step | cosine
  double base_lr = 0.01;
  std::int64_t warmup_steps = 0;
  std::int64_t step_size = 0;    // step: decay every step_size steps (> 0)
  double gamma = 0.1;            // step: decay factor
  std::int64_t total_steps = 0;  // cosine: length of the whole run, warm-up included (> W)
  double min_lr = 0.0;           // cosine: final value
};

class LrSchedule {
 public:
  explicit LrSchedule(const ScheduleOptions& options);
  virtual ~LrSchedule() = default;

  double lr_at(std::int64_t step) const;
  virtual std::string describe() const = 0;
  const ScheduleOptions& options() const { return options_; }

 protected:
  // The value s steps after the warm-up.
  virtual double after_warmup(std::int64_t s) const = 0;
  ScheduleOptions options_;
};

class ConstantLr final : public LrSchedule {
 public:
  using LrSchedule::LrSchedule;
  std::string describe() const override;

 private:
  double after_warmup(std::int64_t s) const override;
};

class StepLr final : public LrSchedule {
 public:
  explicit StepLr(const ScheduleOptions& options);
  std::string describe() const override;

 private:
  double after_warmup(std::int64_t s) const override;
};

class CosineLr final : public LrSchedule {
 public:
  explicit CosineLr(const ScheduleOptions& options);
  std::string describe() const override;

 private:
  double after_warmup(std::int64_t s) const override;
};

// Builds the schedule options.kind names; unknown kinds and bad values are errors naming the field.
std::unique_ptr<LrSchedule> make_schedule(const ScheduleOptions& options);

}  // namespace lockstep::optim
