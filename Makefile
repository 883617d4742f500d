VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mlakit-installed

.PHONY: demo test clean

$(STAMP): pyproject.toml requirements/base.txt requirements/torch-cpu.txt scripts/bootstrap-venv.sh
	./scripts/bootstrap-venv.sh
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m mlakit.cli demo

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info
