// g++ -O3 -march=native -mprefer-vector-width=512 -fopenmp-simd exp16_table_micro.cpp -o m && ./m (perf_tests/NOTES.md, issue 12, thirty-seventh round)
// exp-and-sum over 16 lanes: (A) vpce's input16 polynomial per element (compiler-vectorised, as the pairs loop),
// (B) a 16-entry table + degree-2 minimax (c1 1.0000585, c2 0.5) in GCC vector extensions.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <chrono>
#include <vector>
#include <algorithm>
#include <immintrin.h>
static inline uint32_t bits(float f){uint32_t u; std::memcpy(&u,&f,4); return u;}
static inline float fbits(uint32_t u){float f; std::memcpy(&f,&u,4); return f;}
__attribute__((always_inline)) inline float exp16(float x){
  const float magic=12582912.0f; const float t=x*1.44269504088896341f+magic; const float n=t-magic;
  float r=__builtin_fmaf(-n,0.693147180559945309f,x);
  float p=0.08302771f; p=p*r+0.3357495f; p=p*r+1.0000603f; p=p*r+1.9999337f; p=p*r+2.0f;
  const float scale=fbits(uint32_t((bits(t)-bits(magic)+126u)<<23));
  const float e=p*scale; return x < -86.98f ? 0.0f : e;
}
static const float tab[16]={1.0f,1.0442737824274138f,1.0905077326652577f,1.1387886347566916f,1.189207115002721f,1.241857812073484f,1.2968395546510096f,1.3542555469368927f,1.4142135623730951f,1.4768261459394993f,1.5422108254079407f,1.6104903319492543f,1.681792830507429f,1.7562521603732995f,1.8340080864093424f,1.9152065613971474f};
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
__attribute__((always_inline)) inline vf exp16t(vf x, vf table){
  const float magic=12582912.0f;
  const vf t=x*23.083120654223414f+magic; const vf n=t-magic;
  const vf r=vf(_mm512_fnmadd_ps(__m512(n),_mm512_set1_ps(0.04332169878499658f),__m512(x)));
  vf q=vf(_mm512_fmadd_ps(__m512(r),_mm512_set1_ps(0.49999992f),_mm512_set1_ps(1.00005847f)));
  q=q*r;
  const vi k=vi(vu(t)-vu(vf{}+magic));
  const vf f=vf(vu(__builtin_shuffle(table,k&15))+(vu(k>>4)<<23));
  const vf y=vf(_mm512_fmadd_ps(__m512(q),__m512(f),__m512(f)));
  return x < -86.98f ? vf{} : y;
}
__attribute__((noinline)) float runA(const float* x, long n, float m){
  float part[16]={}; float mx[16]; for(int l=0;l<16;++l) mx[l]=-INFINITY;
  for(long j=0;j<n;j+=16){
#pragma omp simd
    for(int l=0;l<16;++l){ float v=x[j+l]; part[l]+=exp16(v-m); mx[l]= v>mx[l]?v:mx[l]; }
  }
  float s=0; for(int l=0;l<16;++l) s+=part[l]+mx[l]*0; return s;
}
__attribute__((noinline)) float runB(const float* x, long n, float m){
  vf table; std::memcpy(&table,tab,64);
  vf part{}; vf mx=vf{}-INFINITY;
  for(long j=0;j<n;j+=16){
    vf v; std::memcpy(&v,x+j,64);
    part+=exp16t(v-m,table); mx= v>mx?v:mx;
  }
  float s=0; for(int l=0;l<16;++l) s+=part[l]+mx[l]*0; return s;
}
int main(){
  const long n=4096; std::vector<float> x(n); for(long j=0;j<n;++j) x[j]=-20.0f*float((j*2654435761u)%10007)/10007.0f;
  // accuracy of B over [-87, 0]
  { vf table; std::memcpy(&table,tab,64); double worst=0; float wx=0;
    for(float v=-86.9f; v<0.0f; v=std::nextafter(v,1.0f)){ if(((bits(v)>>3)&1))continue; vf a=vf{}+v; vf e=exp16t(a,table); double ex=std::exp(double(v)); double er=std::fabs(e[0]-ex)/ex; if(er>worst){worst=er;wx=v;} }
    printf("B max rel err %.3g at %g\n",worst,wx); }
  volatile float sink=0;
  for(int round=0;round<5;++round){
    double bestA=1e9,bestB=1e9;
    for(int rep=0;rep<400;++rep){
      auto t0=std::chrono::steady_clock::now(); sink=sink+runA(x.data(),n,0.0f); auto t1=std::chrono::steady_clock::now();
      sink=sink+runB(x.data(),n,0.0f); auto t2=std::chrono::steady_clock::now();
      bestA=std::min(bestA,std::chrono::duration<double>(t1-t0).count()); bestB=std::min(bestB,std::chrono::duration<double>(t2-t1).count());
    }
    printf("A %.4f ns/elem  B %.4f ns/elem  B/A %.3f\n",bestA/n*1e9,bestB/n*1e9,bestB/bestA);
  }
  printf("%g %g\n",runA(x.data(),n,0),runB(x.data(),n,0));
}
