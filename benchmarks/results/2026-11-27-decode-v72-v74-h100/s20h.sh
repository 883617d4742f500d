#!/usr/bin/env bash
# Session 20, call 8: with v74's faster merges, more units for ragged batches: v75a RAGGED_PROGRAMS 3, v75b 4,
# v75c 4 with OVERSUBSCRIPTION 6 (the split ceiling 4 at 128h q2 batch 64); A/B against HEAD (v75base), clean L2.
# carry: build/dev/s20h.sh build/dev/s18b.sh build/dev/v75base build/dev/v75a build/dev/v75b build/dev/v75c
cd "$(dirname "$0")/../.."
TEST_S=1 ROUNDS=2 TREES="v75base v75a v75b v75c" \
  CASES="128,64,ragged,1 128,64,ragged,2 128,64,ragged,1,fp8_e4m3 16,64,ragged,1 16,64,ragged,2 128,64,4096,2 128,16,4096,1" \
  bash build/dev/s18b.sh
