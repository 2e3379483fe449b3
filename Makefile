# The two commands of the README, and a few helpers. Run as root on Debian or Ubuntu.
SHELL := /bin/bash
VENV := .venv/bin
export CONTAINERS_CONF := $(CURDIR)/containers.conf
# Tests and the lab call ansible-playbook, molecule and pytest as commands: the locked ones come first.
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: demo test test-lab bootstrap lint lab-down lab-status

## demo: set everything up, bring up the local lab and converge site.yml against it
demo: bootstrap
	$(VENV)/inferhost-lab up

## test: every test layer that CI runs (static, unit, API contract, real kernel, molecule, lab)
# pytest's exit code 5 means it collected no test: a broken suite, reported as such.
test: bootstrap
	@scripts/run-tests.sh

## test-lab: the lab layer alone (site.yml end to end, gpu-switch both ways, validate)
test-lab: bootstrap
	$(VENV)/pytest tests/lab

bootstrap:
	@scripts/bootstrap.sh

lint: bootstrap
	$(VENV)/pytest -m static

lab-down:
	$(VENV)/inferhost-lab down

lab-status:
	$(VENV)/inferhost-lab status
