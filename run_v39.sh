export PYTHONPATH=src PYTHONUNBUFFERED=1
python -m mlakit.bench decode --heads 128 --json $OUT/h128.json --plot $OUT/h128.png > $OUT/h128.txt 2>&1; tail -3 $OUT/h128.txt
python -m mlakit.bench decode --heads 64 --heads 16 --json $OUT/h64-h16.json --plot $OUT/h64-h16.png > $OUT/h64-h16.txt 2>&1; tail -3 $OUT/h64-h16.txt
