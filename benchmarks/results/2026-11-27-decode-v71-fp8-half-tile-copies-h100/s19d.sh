#!/usr/bin/env bash
# Session 19, call 4: v71 (= src: fp8 pages land half a tile a TMA copy, zero-filled block halves): decode GPU tests,
# then the fp8 A/B against v70 (HEAD), two rounds, clean L2.
cd "$(dirname "$0")/../.."
TEST_S=170 ROUNDS=2 TREES="v70 v71" \
  CASES="128,64,4096,1,fp8_e4m3 128,64,4096,2,fp8_e4m3 128,64,ragged,1,fp8_e4m3 128,64,1024,1,fp8_e4m3 16,64,4096,2,fp8_e4m3" \
  bash build/dev/s18b.sh
