"""What one build is to make, worked out before anything runs: the rendered Dockerfile and build
context (and the committed rendered/ copies), the tags, this checkout's build facts, and the plan
(build.py's flags, typed, become one BuildPlan per engine). No Docker.
"""
