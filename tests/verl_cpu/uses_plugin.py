"""Test-only: an external module that uses the plug-in's names at import time (listed after it in
VERL_USE_EXTERNAL_MODULES). Importing it must work however the process came to import the plug-in first."""
from integrations.verl_plugin import grouped_advantages

NAME = grouped_advantages.__name__
