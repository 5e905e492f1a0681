// The exp-and-sum loop over 4096 floats in L1, one core, best of 20 x 2000 passes (issue 12, twenty-first round):
// the library's exp (horner6) against other forms of the same exp. Build: g++ -O3 -march=native
// -mprefer-vector-width=512 -fopenmp-simd (and -march=x86-64-v3); the result column is a checksum.
// horner6: math.hpp's `full` exp; estrin6: the same polynomial by Estrin's scheme; horner5: one degree fewer
// (speed only: not accurate enough); intadd: the scale added to p's exponent bits (plus the NaN select it
// needs) instead of a multiply; horner6_nos: x - m without the logit scale's multiply; tab4_full / tab4_in16:
// 2^(k/4) from a 4-entry table chosen by integer selects, degree 4 / 3 on |r| <= ln2/8; cur_in16: math.hpp's
// `input16` exp; tab16: 2^(k/16) from a 16-entry table, loaded per lane (a gather).
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <chrono>
#include <vector>
#include <cmath>
static inline std::uint32_t as_bits(float x){std::uint32_t u;std::memcpy(&u,&x,4);return u;}
static inline float from_bits(std::uint32_t u){float x;std::memcpy(&x,&u,4);return x;}
static inline float sel(bool c,float a,float b){ std::uint32_t m=-std::uint32_t(c); return from_bits((as_bits(a)&m)|(as_bits(b)&~m));}
template<int V>
static inline float ex(float x){
  constexpr float lo=-86.98f, magic=12582912.0f;
  const float t=x*1.44269504088896341f+magic; const float n=t-magic;
  float r=x-n*0.693145751953125f; r=r-n*1.42860682030941723212e-6f;
  float p;
  if (V==0){ // horner deg 6
    p=0.0027673691511154175f; p=p*r+0.016749631613492966f; p=p*r+0.08333645015954971f; p=p*r+0.33332839608192444f; p=p*r+0.9999998211860657f; p=p*r+2.0f; p=p*r+2.0f;
  } else if (V==1){ // estrin deg 6
    const float r2=r*r; const float r4=r2*r2;
    const float a=2.0f*r+2.0f, b=0.33332839608192444f*r+0.9999998211860657f, c=0.016749631613492966f*r+0.08333645015954971f;
    const float d=0.0027673691511154175f*r2+c; // c4 + c5 r + c6 r^2
    p = (b*r2+a) + d*r4;
  } else if (V==3||V==4){ p=0; } else { // horner deg 5 (same coeffs truncated: speed only)
    p=0.016749631613492966f; p=p*r+0.08333645015954971f; p=p*r+0.33332839608192444f; p=p*r+0.9999998211860657f; p=p*r+2.0f; p=p*r+2.0f;
  }
  if (V==3){
    p=0.0027673691511154175f; p=p*r+0.016749631613492966f; p=p*r+0.08333645015954971f; p=p*r+0.33332839608192444f; p=p*r+0.9999998211860657f; p=p*r+2.0f; p=p*r+2.0f;
    const float e=from_bits(as_bits(p)+((as_bits(t)-as_bits(magic)+std::uint32_t(-1))<<23));
    return sel(x<lo,0.0f,sel(x!=x,x,e));
  }
  if (V>=6 && V<=8){
    if (V==8){ // current input16
      float r1=__builtin_fmaf(-n,0.693147180559945309f,x);
      float q=0.08302771f; q=q*r1+0.3357495f; q=q*r1+1.0000603f; q=q*r1+1.9999337f; q=q*r1+2.0f;
      const float sc=from_bits(std::uint32_t((as_bits(t)-as_bits(magic)+126u)<<23));
      return sel(x<lo,0.0f,q*sc);
    }
    constexpr float lo4=-86.72f;
    const float t4=x*5.77078016355585362f+magic; const float n4=t4-magic;
    float q;
    if (V==6){
      float r4=x-n4*0.17328643798828125f; r4=r4-n4*3.5715170507735431e-7f;
      q=2*0.041658226400613785f; q=q*r4+2*0.16674426198005676f; q=q*r4+2*0.5000001192092896f; q=q*r4+2*0.9999998807907104f; q=q*r4+2.0f;
    } else {
      float r4=__builtin_fmaf(-n4,0.17328679513998632f,x);
      q=2*0.1665719598531723f; q=q*r4+2*0.5002589821815491f; q=q*r4+2*1.0000008344650269f; q=q*r4+2.0f;
    }
    const std::uint32_t k=as_bits(t4)-as_bits(magic);
    const std::uint32_t b0=(k&1u)?0x3f181e10u:0x3f000000u; // 2^(1/4)/2 , 1/2 (placeholder bits, fixed below)
    const std::uint32_t b1=(k&1u)?0x3f5744fdu:0x3f3504f3u;
    std::uint32_t m1=0u-(k&1u); std::uint32_t m2=0u-((k>>1)&1u);
    const std::uint32_t T0=0x3f000000u,T1=0x3f1837f0u,T2=0x3f3504f3u,T3=0x3f5744fdu;
    const std::uint32_t lo_=(T1&m1)|(T0&~m1), hi_=(T3&m1)|(T2&~m1); const std::uint32_t tb=(hi_&m2)|(lo_&~m2);
    (void)b0;(void)b1;
    const float sc=from_bits(tb+(std::uint32_t(std::int32_t(k)>>2)<<23));
    return sel(x<lo4,0.0f,q*sc);
  }
  if (V==4){
    static const float tab[16]={1.0f,1.0442737824274138f,1.0905077326652577f,1.1387886347566916f,1.189207115002721f,1.2418578120734840f,1.2968395546510096f,1.3542555469368927f,1.4142135623730951f,1.4768261459394993f,1.5422108254079407f,1.6104903319492543f,1.6817928305074290f,1.7562521603732995f,1.8340080864093424f,1.9152065613971474f};
    constexpr float m16=12582912.0f;
    const float t16=x*23.083120654223414f+m16; const float n16=t16-m16;
    float rr=x-n16*0.0433216094970703125f; rr=rr-n16*8.9287926269338577e-8f;
    float q=0.16666667f; q=q*rr+0.5f; q=q*rr+1.0f; q=q*rr+1.0f;
    const std::uint32_t k=as_bits(t16)-as_bits(m16);
    const float e=from_bits(as_bits(q*tab[k&15])+((k>>4)<<23));
    return sel(x<lo,0.0f,sel(x!=x,x,e));
  }
  const float scale=from_bits(std::uint32_t((as_bits(t)-as_bits(magic)+126u)<<23));
  return sel(x<lo,0.0f,p*scale);
}
template<int V> __attribute__((noipa)) float run(const float* x,long n,float m,float s){
  float part[16]={}; float mx[16]; for(int l=0;l<16;++l) mx[l]=-INFINITY;
  for(long j=0;j<n;j+=16){
#pragma omp simd
    for(int l=0;l<16;++l){ const float v=x[j+l]; const float e=(V==5)?ex<0>(v-m):ex<V>(v*s-m); part[l]+=e; mx[l]=v>mx[l]?v:mx[l]; }
  }
  float t=0; for(int l=0;l<16;++l) t+=part[l]+mx[l]*1e-30f; return t;
}
int main(){
  const long n=4096; std::vector<float> x(n); for(long i=0;i<n;++i) x[i]=std::sin(i*0.1f)*5;
  volatile float sv=1.0f, mv=5.0f; float s=sv,m=mv;
  auto T=[&](auto f,const char* nm){ double best=1e9; float acc=0; for(int k=0;k<20;++k){auto t0=std::chrono::steady_clock::now(); for(int it=0;it<2000;++it) acc+=f(x.data(),n,m,s); double dt=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count(); if(dt<best)best=dt;} printf("%s %.3f ns/elem (%.3f cyc@4GHz) %g\n",nm,best/(2000.0*n)*1e9,best/(2000.0*n)*4e9,acc);};
  T(run<0>,"horner6"); T(run<1>,"estrin6"); T(run<2>,"horner5"); T(run<3>,"intadd"); T(run<5>,"horner6_nos"); T(run<6>,"tab4_full"); T(run<8>,"cur_in16"); T(run<7>,"tab4_in16"); T(run<4>,"tab16");
}
