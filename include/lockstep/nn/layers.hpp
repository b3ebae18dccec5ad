// Every layer type in one include, for code that builds models by hand.
#pragma once

#include "lockstep/nn/activation.hpp"
#include "lockstep/nn/batchnorm.hpp"
#include "lockstep/nn/conv.hpp"
#include "lockstep/nn/dropout.hpp"
#include "lockstep/nn/flatten.hpp"
#include "lockstep/nn/init.hpp"
#include "lockstep/nn/linear.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/pool.hpp"
#include "lockstep/nn/residual.hpp"
#include "lockstep/nn/sequential.hpp"
#include "lockstep/nn/transformer.hpp"
