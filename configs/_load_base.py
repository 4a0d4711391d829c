"""Imports configs/base.py by path, so task configs work from any working directory."""

import importlib.util
import pathlib


def base_config():
    path = pathlib.Path(__file__).with_name("base.py")
    spec = importlib.util.spec_from_file_location("poad_configs_base", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()
