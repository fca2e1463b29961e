"""Python code of the Triton models in the rendered repository (preprocessing, postprocessing,
the CPU ``tensorrt_llm`` model and the ``tensorrt_llm_bls`` orchestrator). Each model's
``1/model.py`` in ``model_repo_templates/`` only imports its ``TritonPythonModel`` from here, so
the stub needs the project root on ``PYTHONPATH`` (``specdeploy serve`` sets it). Modules that
import ``triton_python_backend_utils`` run only inside the Python-backend stub."""
