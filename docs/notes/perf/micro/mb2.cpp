#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
#include <c10/util/BFloat16.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <random>
using fVec = at::vec::Vectorized<float>;
using bVec = at::vec::Vectorized<c10::BFloat16>;
static inline fVec zf(fVec x){ const fVec c1(-1.5957691216057308f), c3(-0.07135481627260025f); return x*at::vec::fmadd(x*x,c3,c1);}
struct Id { static fVec f(fVec x){ return x; } };
struct B2 { static fVec f(fVec x){ return x/(fVec(1.f)+zf(x).exp()); } };
struct C2 { static fVec f(fVec x){ fVec z=zf(x); fVec r= x/(fVec(1.f)+z.exp_u20()); return fVec::blendv(r, x*fVec(0.f), z>fVec(88.f)); } };
struct C3 { static fVec f(fVec x){ fVec z=zf(x); return x/(fVec(1.f)+z.exp_u20()); } };
struct C4 { static fVec f(fVec x){ fVec z=zf(x); return x*(fVec(1.f)+z.exp_u20()).reciprocal(); } };
template<class F> double runb(const c10::BFloat16* in, c10::BFloat16* out, int64_t n, int reps){
  auto t0=std::chrono::steady_clock::now();
  for(int r=0;r<reps;r++) for(int64_t i=0;i<n;i+=bVec::size()){ auto [a,b]=at::vec::convert_to_float<c10::BFloat16>(bVec::loadu(in+i)); at::vec::convert_from_float<c10::BFloat16>(F::f(a),F::f(b)).store(out+i);}
  return std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count()/(double(n)*reps)*1e9;
}
template<class F> double runf(const float* in, float* out, int64_t n, int reps){
  auto t0=std::chrono::steady_clock::now();
  for(int r=0;r<reps;r++) for(int64_t i=0;i<n;i+=fVec::size()){ F::f(fVec::loadu(in+i)).store(out+i);}
  return std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count()/(double(n)*reps)*1e9;
}
template<class F> void both(const char* nm, const float* fi, float* fo, const c10::BFloat16* bi, c10::BFloat16* bo, int64_t n){
  double a=1e9,b=1e9; for(int k=0;k<5;k++){ a=std::min(a,runf<F>(fi,fo,n,1000)); b=std::min(b,runb<F>(bi,bo,n,1000)); }
  printf("%-3s fp32 %.3f ns  bf16 %.3f ns\n",nm,a,b);
}
int main(){ int64_t n=16384; std::vector<float> fi(n),fo(n); std::vector<c10::BFloat16> bi(n),bo(n); std::mt19937 g(1); std::normal_distribution<float> d(0,2);
 for(int64_t i=0;i<n;i++){fi[i]=d(g); bi[i]=fi[i];}
 both<Id>("Id",fi.data(),fo.data(),bi.data(),bo.data(),n);
 both<B2>("B2",fi.data(),fo.data(),bi.data(),bo.data(),n);
 both<C2>("C2",fi.data(),fo.data(),bi.data(),bo.data(),n);
 both<C3>("C3",fi.data(),fo.data(),bi.data(),bo.data(),n);
 both<C4>("C4",fi.data(),fo.data(),bi.data(),bo.data(),n);
}
