"""The ``fedqhd`` command (:mod:`fedqhd.commands.main`) and its sub-commands, one module
each: ``data``, ``bench``, ``pool``, ``privacy`` and ``deploy``. Thin: they parse the
arguments, call the studies, the apps or the numeric core, and print."""
