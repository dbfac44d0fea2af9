"""Run in a forked launcher before `paddle.distributed.launch` starts (launch_helpers.launch, `inject`).

The launcher's pod looks at its ranks once a second (`Pod.watch(interval=1)`, job/pod.py), so each launch of the
suite waited ~0.5 s on average after its ranks had ended (0.42 s a launch, measured over 2-rank launches of the
micro model: 3.19 against 2.78 s): here it looks every 0.05 s. Nothing else of the launcher changes, and the
launches that tests signal or time themselves (`launch_cmd`, scripts/launch.sh) keep Paddle's interval.
"""
from paddle.distributed.launch.job import pod

pod.Pod.watch.__defaults__ = tuple(0.05 if name == "interval" else value for name, value in
                                   zip(pod.Pod.watch.__code__.co_varnames[1:], pod.Pod.watch.__defaults__))
