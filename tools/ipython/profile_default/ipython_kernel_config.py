# Kernels started by the Makefile (papermill, nbval) use this profile (IPYTHONDIR=tools/ipython):
# it keeps ipykernel's start-up notice about unencrypted TCP out of test logs.
c = get_config()  # noqa: F821
c.IPKernelApp.log_level = "ERROR"
