// The diagonally preconditioned CG of the marginalized graph kernel's solvers (mgk*.cu).  A solver
// supplies the team that sums (a warp, a block, a cluster: common/reductions.cuh, teams.cuh) and an
// operator owning the vectors; the loops here hold the scalars and every decision.  Scalars are
// summed in double in both precisions, alpha and beta rounded to the vector type once.  Stop at
// ||r|| <= tol ||b||, p^T A p <= 0 (only an exactly zero residual: M = D / V - A1 (x) A2 (.) E is
// positive definite) or max_iter.  Decisions come from team sums, the same bits in every thread.
#pragma once

namespace mgk {

// The scalars of one CG system: r^T z, ||b||, ||r||, iterations done, and (lockstep) still running.
struct CGState {
    double rz, bnorm, rnorm;
    int it;
    bool running;
};

// After the sums of r^T r and r^T z: counts the iteration, stops a converged system (beta 0), else
// returns beta and keeps r^T z.
template <typename T>
__device__ __forceinline__ T cg_finish(CGState& cg, double rr, double rzn, double tol) {
    ++cg.it;
    cg.rnorm = sqrt(rr);
    if (cg.rnorm <= tol * cg.bnorm) {
        cg.running = false;
        return T(0);
    }
    const T beta = (T)(rzn / cg.rz);
    cg.rz = rzn;
    return beta;
}

// x += alpha p, r -= alpha Ap at this thread's elements i = first, first + step, ... < n (p read at
// i * PS: PS = 2 where two systems' directions are interleaved); adds its shares of r^T r and r^T z
// (z = r / diag).  The vector loop of every solver's CG step.
template <int PS = 1, typename T, typename I>
__device__ __forceinline__ void cg_update(T* x, T* r, const T* p, const T* Ap, const T* diag, T alpha, I first, I step,
                                          I n, double& rr, double& rz) {
    for (I i = first; i < n; i += step) {
        x[i] = x[i] + alpha * p[PS * i];
        const T ri = r[i] - alpha * Ap[i];
        r[i] = ri;
        rr += (double)ri * ri;
        rz += (double)ri * (ri / diag[i]);
    }
}

// CG on M x = b from the state the caller set up (x0, r0, p0 = z0 = r0 / diag, cg.rz = r0^T z0,
// cg.bnorm = cg.rnorm = ||b||).  The operator:
//   double product()                          Ap = M p; this thread's share of p^T Ap
//   void step(T alpha, double& rr, double& rz)  x += alpha p, r -= alpha Ap; adds this thread's
//                                              shares of r^T r and r^T z (z = r / diag)
//   void new_direction(T beta)                p = z + beta p, ordered before the next product
template <typename T, typename Team, typename Op>
__device__ __forceinline__ void preconditioned_cg(const Team& team, Op& op, CGState& cg, double tol, int max_iter) {
    while (cg.it < max_iter) {
        double pAp[1] = {op.product()};
        team.sum(pAp);
        if (!(pAp[0] > 0)) break;
        double upd[2] = {0.0, 0.0};  // r^T r, r^T z
        op.step((T)(cg.rz / pAp[0]), upd[0], upd[1]);
        team.sum(upd);
        ++cg.it;
        cg.rnorm = sqrt(upd[0]);
        if (cg.rnorm <= tol * cg.bnorm) break;
        const T beta = (T)(upd[1] / cg.rz);
        cg.rz = upd[1];
        op.new_direction(beta);
    }
}

// Two systems with the same matrix, x (side 0) and the adjoint y (side 1), in lockstep: while both
// run, one pass of the product serves both; a side that stops leaves the other to run on alone.
// With adjoint_started false, y starts only once x has stopped, from op.warm_adjoint (the
// sequential form, one direction array).  Both states start with running set as the caller wants.
// The operator:
//   void product(bool run_x, bool run_y, double (&pAp)[2])  Ap = M p of the running sides; adds
//                                                            this thread's shares of p^T Ap
//   void step(int side, T alpha, double& rr, double& rz)    as preconditioned_cg's, for one side
//   void new_directions(bool run_x, bool run_y, T beta_x, T beta_y)
//   bool warm_adjoint(CGState& sy)                           y's start; whether it has to run
template <typename T, typename Team, typename Op>
__device__ __forceinline__ void lockstep_cg(const Team& team, Op& op, CGState& sx, CGState& sy, bool adjoint_started,
                                            double tol, int max_iter) {
    while (true) {
        sx.running = sx.running && sx.it < max_iter;
        sy.running = sy.running && sy.it < max_iter;
        if (!sx.running && !sy.running) {
            if (adjoint_started) break;
            adjoint_started = true;
            sy.running = op.warm_adjoint(sy);
            continue;
        }
        double pAp[2] = {0.0, 0.0};
        op.product(sx.running, sy.running, pAp);
        team.sum(pAp);
        sx.running = sx.running && pAp[0] > 0;
        sy.running = sy.running && pAp[1] > 0;
        double upd[4] = {0.0, 0.0, 0.0, 0.0};  // r^T r and r^T z of x, then of y
        if (sx.running) op.step(0, (T)(sx.rz / pAp[0]), upd[0], upd[1]);
        if (sy.running) op.step(1, (T)(sy.rz / pAp[1]), upd[2], upd[3]);
        team.sum(upd);
        const T beta_x = sx.running ? cg_finish<T>(sx, upd[0], upd[1], tol) : T(0);
        const T beta_y = sy.running ? cg_finish<T>(sy, upd[2], upd[3], tol) : T(0);
        op.new_directions(sx.running, sy.running, beta_x, beta_y);
    }
}

}  // namespace mgk
