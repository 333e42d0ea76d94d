"""The command-line tools layer: ``hloalias-opt`` and the example job."""

from hloalias._layers import alias_bare_import

alias_bare_import(__name__, "hloalias.tools")
