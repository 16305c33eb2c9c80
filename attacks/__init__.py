"""secfed.attacks — the privacy audit (``secfed audit``): attacks on everything a client shares, and
verdicts a CI can gate on.

    audit          run_audit(AuditRequest) → AuditReport: targets, budget, evidence, verdicts
    evidence       what a run shared: recorded uploads and broadcasts, or the client's real step re-run
    local_training the adversary's model of a client's local SGD (Nesterov, weight decay, steps)
    probes         closed-form leaks: a Linear with bias, a Linear followed by BatchNorm statistics
    inversion      gradient inversion of an update or a sum (Geiping et al.), head-agnostic, unrolled
    model_inversion DeepInversion of global weights; inversion of a feature statistic
    dfs            DFH's domain feature statistics: the contract, membership/linkage, inversion
    protocol       same model, cohort sizes, differencing, what the logs keep
    judge          re-identification (the run's embedding and pixels), PSNR/SSIM (scikit-image)
    verdict        LEAK / NO-LEAK-AT-THIS-STRENGTH / INCONCLUSIVE from tests and residuals
    targets        the attacks of each target, run and judged
    controls       calibration controls: updates with known victims (tests and bench/bench_audit.py)
    report         audit.json, audit.md, image grids, the terminal table
    budget         quick / standard / thorough, and the stopwatch every attack stops at
"""

from secfed.attacks.audit import AuditReport, AuditRequest, run_audit
from secfed.attacks.verdict import Verdict

__all__ = ["AuditReport", "AuditRequest", "Verdict", "run_audit"]
