#!/usr/bin/env bash
# Forty-second session, call 1 of a pair: carry ["build/t39a"] (the first part of the packed Triton 3.9.0), kept by
# the warm machine for s42d.sh.
ls -la build/t39a
