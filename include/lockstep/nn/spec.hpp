// clang-format off
// The spec language: a model as one line of text (the trainer's model.spec), one front end of
// Model (src/nn/spec.cpp turns the text into modules; Model::build is its entry point). The same
// spec, sample shape, classes and seed always build the same parameters, bit for bit.
//
// Spec grammar (whitespace ignored; layers joined by '-'; arguments positional in the order shown,
// or key=value in any order; [..] optional with the default shown):
//   conv(out, k[, stride=1][, pad=0][, bias=1])   2-D convolution, k x k kernel
//   linear(out[, bias=1])                         fully connected; input must be [N, features]
//   bn                                            BatchNorm1d on [N, C], BatchNorm2d on [N, C, H, W]
//   relu | gelu                                   activations (GELU: exact erf form)
//   maxpool(k[, stride=k][, pad=0])               max pooling
//   avgpool(k[, stride=k][, pad=0])               average pooling
//   gap                                           global average pooling, [N, C, H, W] -> [N, C]
//   flatten                                       [N, ...] -> [N, features]
//   dropout(p)                                    inverted dropout, 0 <= p < 1
//   res(out[, stride=1])                          ResNet basic block (identity or 1x1 shortcut)
//   bottleneck(width[, stride=1])                 ResNet bottleneck block (v1.5: the stride on
//                                                 the 3x3), 1x1-3x3-1x1, output 4 * width
//                                                 channels (identity or 1x1 shortcut)
//   embed(vocab, ctx, dim[, pad_vocab=128])       token + position embedding, i32 [N, T] ->
//                                                 [N, T, dim]; T > ctx is an error; the token
//                                                 table's rows padded to a multiple of pad_vocab
//                                                 (1: none; nn::kVocabPadding)
//   block(heads[, depth=1])                       pre-LN transformer block (GPT-2); depth, the
//                                                 number of blocks, scales the residual init
//   ln                                            LayerNorm over the last dimension
//   lmhead                                        logits [N*T, vocab] tied to the last embed's
//                                                 token table (no parameter of its own)
// Presets (the whole spec):
//   mlp[:h1,h2,...]   flatten-linear(h1)-relu-...-linear(hk)-relu-linear(classes);
//                     default 1024,1024
//   lenet             conv(6,5,pad=2)-relu-maxpool(2)-conv(16,5)-relu-maxpool(2)-flatten-
//                     linear(120)-relu-linear(84)-relu-linear(classes)
//   resnet[:n]        CIFAR-style ResNet-(6n+2), n blocks per stage (default 2): conv(16,3,pad=1,
//                     bias=0)-bn-relu, stages res(16), res(32,2), res(64,2), then
//                     gap-linear(classes)
//   resnet18 | resnet34 | resnet50
//                     torchvision.models.resnet18/34/50 (11.7M/21.8M/25.6M parameters at 1000
//                     classes): the ImageNet stem conv(64,7,stride=2,pad=3,bias=0)-bn-relu-
//                     maxpool(3,stride=2,pad=1), four stages of widths 64, 128, 256, 512 (stages
//                     2-4 start with stride 2) of res(w) blocks [2,2,2,2] / [3,4,6,3] or of
//                     bottleneck(w) blocks [3,4,6,3], then gap-linear(classes). The final maps are
//                     1/32 of the input (224x224: 7x7; 32x32: 1x1)
//   gpt(layers, heads, dim[, ctx][, vocab][, pad_vocab=128])
//                     GPT-2: embed(vocab,ctx,dim)-block(heads,depth=layers) x layers-ln-lmhead,
//                     GPT-2/llm.c initialisation. The data's sample shape is [T] (i32 tokens):
//                     ctx defaults to T and must be >= T; vocab defaults to num_classes and must
//                     equal it. The output is one row of logits per position, [N*T, vocab].
//                     pad_vocab pads the token table (embed's; written into the expansion only
//                     when it is not 128): GPT-2's 50257 rows become 50304.
//   gpt2-124m | gpt2-350m | gpt-mini | gpt-tiny
//                     gpt(12,12,768,ctx=1024,vocab=50257), gpt(24,16,1024,ctx=1024,vocab=50257),
//                     gpt(4,4,256,ctx=256), gpt(2,2,128,ctx=128); key=value arguments in
//                     parentheses override the preset's (gpt-mini(ctx=64), gpt2-124m(vocab=256))
// Classifier head: a spec whose last layer is linear(out) (or lmhead) must have out == num_classes. A spec
// that ends in any other layer gets a head appended: `flatten` if the output is not yet
// [N, features], then `linear(num_classes)` (so `conv(8,3)-relu-gap` is a valid model).
// Errors (unknown layer, bad argument, shapes that do not fit the sample shape) throw
// lockstep::Error quoting the spec with a caret under the offending layer.
// clang-format on
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::nn {

// The context (ctx) a gpt(...) spec or preset states, or 0 when it leaves ctx to the data (or is
// not a gpt spec): what a trainer opening token data uses as the window length T.
std::int64_t spec_context(const std::string& spec);

}  // namespace lockstep::nn
