#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cmath>
#include <random>
using fVec = at::vec::Vectorized<float>;
static inline fVec inner(fVec x){ const fVec beta(0.7978845608028654f), kappa(0.044715f); return beta*(x+kappa*x*x*x);}
struct A { static fVec f(fVec x){ return fVec(0.5f)*x*(fVec(1.f)+inner(x).tanh()); } };
struct B { static fVec f(fVec x){ return x/(fVec(1.f)+ (inner(x)*fVec(-2.f)).exp()); } };
struct C { static fVec f(fVec x){ return x/(fVec(1.f)+ (inner(x)*fVec(-2.f)).exp_u20()); } };
// folded constants: -2*beta*(x + k x^3) = x*(c1 + c3 x^2)
struct B2 { static fVec f(fVec x){ const fVec c1(-2*0.7978845608028654f), c3(-2*0.7978845608028654f*0.044715f); fVec x2=x*x; fVec z=x*at::vec::fmadd(x2,c3,c1); return x/(fVec(1.f)+z.exp()); } };
struct C2 { static fVec f(fVec x){ const fVec c1(-2*0.7978845608028654f), c3(-2*0.7978845608028654f*0.044715f); fVec x2=x*x; fVec z=x*at::vec::fmadd(x2,c3,c1); return x/(fVec(1.f)+z.exp_u20()); } };
struct FG { static fVec f(fVec x){ return x/(fVec(1.f)+(fVec(-1.702f)*x).exp()); } };
template<class F> double run(const float* in, float* out, int64_t n, int reps){
  auto t0=std::chrono::steady_clock::now();
  for(int r=0;r<reps;r++) for(int64_t i=0;i<n;i+=2*fVec::size()){ fVec a=fVec::loadu(in+i), b=fVec::loadu(in+i+fVec::size()); F::f(a).store(out+i); F::f(b).store(out+i+fVec::size()); }
  auto t1=std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1-t0).count()/ (double(n)*reps)*1e9;
}
template<class F> void err(const char* name, const float* in, int64_t n, int reps, float* out){
  double best=1e9; for(int k=0;k<5;k++) best=std::min(best, run<F>(in,out,n,reps));
  double maxrel=0, maxabs=0, worst=0;
  for(int64_t i=0;i<n;i++){ double x=in[i]; double ref=0.5*x*(1+std::tanh(std::sqrt(2/M_PI)*(x+0.044715*x*x*x)));
    double e=std::fabs(out[i]-ref); maxabs=std::max(maxabs,e); double tol=1e-5+1e-5*std::fabs(ref); if(e/tol>worst) worst=e/tol; }
  printf("%-4s %.3f ns/elem  maxabs %.2e  worst err/tol %.3f\n", name, best, maxabs, worst);
}
int main(){
  int64_t n=16384; std::vector<float> in(n), out(n); std::mt19937 g(1); std::normal_distribution<float> d(0,2);
  for(auto& v: in) v=d(g);
  // include wide range
  for(int64_t i=0;i<1024;i++) in[i]= -12.f + 24.f*i/1024;
  int reps=2000;
  err<A>("A",in.data(),n,reps,out.data());
  err<B>("B",in.data(),n,reps,out.data());
  err<B2>("B2",in.data(),n,reps,out.data());
  err<C>("C",in.data(),n,reps,out.data());
  err<C2>("C2",in.data(),n,reps,out.data());
  double best=1e9; for(int k=0;k<5;k++) best=std::min(best, run<FG>(in.data(),out.data(),n,reps)); printf("fastgelu %.3f ns\n",best);
}
