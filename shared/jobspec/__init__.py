"""What a job asks for: the job spec (run_glue_no_trainer.py's arguments), the GLUE tasks, metric rules, the
schedule's arithmetic, how a spec names models and files (and what a named upload stands for), and the
words its validation errors are told in. Torch-free; the client's command line reads it too.
"""
