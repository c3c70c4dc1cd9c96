/* qgemm on SmolLM2-135M's shapes: 30 layers x (q, k, v, o, gate, up, down) in Q4_1 and the 49152 x 576 Q8_0
 * head, M = 1..8 rows of x, best of 30 passes; weights from memory (30 distinct layer copies, 96 MB, past the
 * 32 MiB L3) or, with argument 1, one layer's copy reused (cached).  Random codes and small fp16 scales.
 * Build against a qgemm.c:  gcc -O3 -march=native -fopenmp -std=gnu11 -o qgemm_rows qgemm_rows.c qgemm.c -lm */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <omp.h>
int hyspec_qgemm(int qtype, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint8_t *mk(int qtype,int64_t n,int64_t k){int bs=qtype==0?18:qtype==1?20:34;int64_t nb=n*(k/32);uint8_t*b=malloc(nb*bs);
 for(int64_t i=0;i<nb*bs;i++)b[i]=rand();
 for(int64_t i=0;i<nb;i++){uint16_t d=0x2000+(rand()&0x3ff);memcpy(b+i*bs,&d,2);if(qtype==1){uint16_t m=0xA000+(rand()&0x3ff);memcpy(b+i*bs+2,&m,2);}}
 return b;}
int main(int argc,char**argv){
 int cached=argc>1&&atoi(argv[1]);int NL=cached?1:30;
 int64_t sh[7][2]={{576,576},{192,576},{192,576},{576,576},{1536,576},{1536,576},{576,1536}};
 uint8_t *W[30][7];for(int l=0;l<NL;l++)for(int j=0;j<7;j++)W[l][j]=mk(1,sh[j][0],sh[j][1]);
 uint8_t*H=mk(2,49152,576);
 float*x=malloc(8*1536*4),*y=malloc(8*49152*4);for(int i=0;i<8*1536;i++)x[i]=(rand()%1000-500)*1e-3f;
 int Ms[]={1,2,3,4,6,8};
 for(int mi=0;mi<6;mi++){int M=Ms[mi];double bl=1e9,bh=1e9;
  for(int it=0;it<30;it++){double t0=now();for(int l=0;l<30;l++)for(int j=0;j<7;j++)hyspec_qgemm(1,x,M,sh[j][1],W[cached?0:l][j],sh[j][0],y);
   double t1=now();hyspec_qgemm(2,x,M,576,H,49152,y);double t2=now();if(t1-t0<bl)bl=t1-t0;if(t2-t1<bh)bh=t2-t1;}
  printf("M=%d layers %6.2f ms head %5.2f total %6.2f\n",M,bl*1e3,bh*1e3,(bl+bh)*1e3);}
 return 0;}
