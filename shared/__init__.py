"""The code the API (service/) and the workers (worker/) share, in subpackages named for what they
hold: core, jobspec, data, model_folders, submission, queue, jobs_repo, research, webhooks, searches.
Each imports only those before it in that list (tests/project/test_imports.py: SHARED_LAYERS); shared/
imports neither service/ nor worker/, and nothing here imports torch.
"""
